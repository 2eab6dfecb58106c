"""The fused model (`course_lib.fast_path`) against the reference model: same logits, same greedy tokens."""
from __future__ import annotations

import copy

import pytest
import torch

from course_lib import LLM, SamplingParams
from course_lib.fast_path import FusedAttention, FusedMLP, use_fast_path
from course_lib.kv_cache import KVCache


@pytest.mark.parametrize("attention_bias", [False, True])
def test_fused_model_matches_reference(attention_bias, tiny):
    ref = tiny(attention_bias)
    fast = use_fast_path(copy.deepcopy(ref))
    assert not isinstance(ref.layers[0].self_attn, FusedAttention)
    assert isinstance(fast.layers[0].self_attn, FusedAttention) and isinstance(fast.layers[0].mlp, FusedMLP)
    assert not hasattr(fast.layers[0].self_attn, "q_proj")  # removed, not kept as a copy
    n_ref = sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in fast.parameters()) == n_ref
    ids = torch.randint(0, 97, (2, 17))
    torch.testing.assert_close(fast(ids), ref(ids), rtol=1e-12, atol=1e-12)
    # with a cache: prefill then decode steps
    caches = [KVCache(ref.config, 32, batch=2, dtype=torch.float64) for _ in range(2)]
    outs = [m(ids, kv=c) for m, c in zip((ref, fast), caches)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
    step = ids[:, -1:]
    for _ in range(3):
        a, b = ref(step, kv=caches[0]), fast(step, kv=caches[1])
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
        step = a[:, -1].argmax(-1, keepdim=True)


def test_engine_fast_path_greedy_equals_reference(llm):
    fast = LLM(device="cpu", fast_path=True)
    prompts = ["The capital of France is", "Write a haiku about the KV cache.", "1, 2, 3, 4,"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in fast.generate(prompts, params)]
    assert got == want


def test_fast_path_option_checked():
    with pytest.raises(TypeError, match="fast_path"):
        LLM(device="cpu", fast_path="yes")
