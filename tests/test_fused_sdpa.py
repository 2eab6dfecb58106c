"""Attention calls SDPA in forms PyTorch's fused CUDA kernels accept, so no prompt falls back to the math kernel.

The CPU build cannot answer `torch.backends.cuda.can_use_flash_attention` / `can_use_efficient_attention`
(False for any input), so each call's arguments are checked against the documented conditions instead
(`F.scaled_dot_product_attention`'s notes; `sdp_utils.cpp`):
    FlashAttention    no attn_mask; float16 or bfloat16; head_dim <= 256; GQA allowed
    memory-efficient  attn_mask allowed; as many KV heads as query heads (GQA works "only for Flash_attention
                      and math kernel"); float32 too
    both              4-D inputs, the last dimension contiguous, head_dim a multiple of 8
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import causal_attention
from course_lib.attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache
from course_lib.config import ModelConfig

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16  # the default model's attention


def fused_kernels(call: dict) -> set[str]:
    """Which of the fused CUDA kernels take this SDPA call's arguments."""
    q, k, v, d = call["q"], call["k"], call["v"], call["q"].shape[-1]
    if not all(t.dim() == 4 and t.stride(-1) == 1 for t in (q, k, v)) or d % 8:
        return set()
    kernels = set()
    if call["attn_mask"] is None and q.dtype in (torch.float16, torch.bfloat16) and d <= 256:
        kernels.add("flash")
    if q.shape[1] == k.shape[1] == v.shape[1]:
        kernels.add("efficient")
    return kernels


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[dict]:
    """Every `F.scaled_dot_product_attention` call's arguments while the test runs; the calls still compute."""
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        calls.append(dict(q=q, k=k, v=v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def test_the_check_refuses_a_mask_with_gqa():
    """The form this module replaced: a boolean mask with 9 query heads over 3 KV heads runs on the math kernel."""
    q, k = torch.zeros(1, HEADS, 8, HEAD_DIM, dtype=torch.float16), torch.zeros(1, KV_HEADS, 8, HEAD_DIM,
                                                                               dtype=torch.float16)
    assert fused_kernels(dict(q=q, k=k, v=k, attn_mask=torch.ones(8, 8, dtype=torch.bool))) == set()
    assert fused_kernels(dict(q=q, k=k, v=k, attn_mask=None)) == {"flash"}


def paged_step(seqs: list[tuple[int, int]]) -> None:
    """One engine-like step in float16: seqs are (context after the step, new tokens), packed in one row."""
    cfg = ModelConfig(vocab_size=8, hidden_size=HEADS * HEAD_DIM, intermediate_size=8, num_layers=1,
                      num_heads=HEADS, num_kv_heads=KV_HEADS)
    tables, at = [], 0
    for ctx, _ in seqs:
        tables.append(list(range(at, at + -(-ctx // BLOCK))))
        at += len(tables[-1])
    cache = PagedKVCache(cfg, at, BLOCK, dtype=torch.float16)
    md = PagedAttentionMetadata.build(tables, [c for c, _ in seqs], [n for _, n in seqs], BLOCK)
    n = md.num_tokens
    q, k, v = (torch.randn(1, n, h, HEAD_DIM).to(torch.float16) for h in (HEADS, KV_HEADS, KV_HEADS))
    PagedAttention(cache, md).attend(0, q, k, v)


def test_a_whole_prompt_takes_flash_attention(sdpa_calls):
    paged_step([(512, 512)])
    assert len(sdpa_calls) == 1 and "flash" in fused_kernels(sdpa_calls[0])


@pytest.mark.parametrize("seqs", [[(160, 100)], [(512, 512), (40, 7), (33, 1), (90, 1)], [(20, 20), (30, 30)]],
                         ids=["chunk after cached tokens", "prompt, chunk and decodes", "two prompts"])
def test_every_step_takes_a_fused_kernel(sdpa_calls, seqs):
    paged_step(seqs)
    assert sdpa_calls and all(fused_kernels(c) for c in sdpa_calls), [fused_kernels(c) for c in sdpa_calls]


@pytest.mark.parametrize("tq, tk, start, kernel", [(16, 16, 0, "flash"), (1, 16, 15, "flash"),
                                                   (5, 16, 11, "efficient"), (3, 16, 4, "efficient")])
def test_causal_attention_takes_a_fused_kernel(sdpa_calls, tq, tk, start, kernel):
    """A whole prompt and a decode step without a mask; a chunk after cached tokens with K/V expanded."""
    q = torch.randn(1, tq, HEADS, HEAD_DIM).to(torch.float16)
    k, v = (torch.randn(1, tk, KV_HEADS, HEAD_DIM).to(torch.float16) for _ in range(2))
    causal_attention(q, k, v, start=start)
    assert len(sdpa_calls) == 1 and kernel in fused_kernels(sdpa_calls[0])
