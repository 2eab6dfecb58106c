"""Paged attention: PyTorch backend vs plain causal attention, the C++ and Triton kernels (`course_lib.accel`) vs
PyTorch, model parity.

The Triton comparison runs this file as a script in a subprocess with TRITON_INTERPRET=1, because
the variable must be set before triton is imported and the pytest process may have imported it already.
"""
from __future__ import annotations

import os

import pytest
import torch

from course_lib import tolerance
from course_lib.attention import causal_attention, reference_attention
from course_lib.attention.paged import (
    PagedAttention,
    PagedAttentionMetadata,
    PagedKVCache,
    paged_decode_attention,
    slots_for,
    store_kvcache,
)
from course_lib.config import ModelConfig
from course_lib.model import Transformer
from tests.paged_inputs import random_decode_batch, shuffled_block_tables

HEADS, KV_HEADS, HEAD_DIM = 6, 2, 8  # GQA: 3 query heads per KV head


def tiny_config(**kw) -> ModelConfig:
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    return ModelConfig(**{**sizes, **kw})


def test_metadata_build_slots_and_padding():
    md = PagedAttentionMetadata.build(block_tables=[[3, 1], [0]], context_lens=[6, 2], query_lens=[3, 1],
                                      block_size=4)
    # seq 0 computes positions 3, 4, 5 -> block 3 offset 3, block 1 offsets 0, 1; seq 1 position 1 -> block 0
    assert md.slot_mapping.tolist() == [15, 4, 5, 1]
    assert md.block_tables.tolist() == [[3, 1], [0, -1]] and md.block_tables.dtype == torch.int32
    assert md.query_start_loc.tolist() == [0, 3, 4] and md.context_lens.tolist() == [6, 2]
    assert (md.max_query_len, md.max_context_len, md.num_seqs, md.num_tokens) == (3, 6, 2, 4)
    with pytest.raises(ValueError, match="context_len"):
        PagedAttentionMetadata.build([[0]], context_lens=[5], query_lens=[1], block_size=4)


def test_kv_cache_sizing():
    cfg = tiny_config()
    per_block = PagedKVCache.bytes_per_block(cfg, block_size=4)
    assert per_block == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 * 4  # K and V, float32
    cache = PagedKVCache(cfg, num_blocks=10, block_size=4)
    assert cache.num_blocks == 10 and cache.nbytes == 10 * per_block
    assert cache.k_cache.shape == (cfg.num_layers, 10, 4, cfg.num_kv_heads, cfg.head_dim)


def kernels():
    """The built C++ extension (`course_lib.accel.build`); the tests that call it are marked needs_cpp."""
    from course_lib.accel.build import build

    return build().module


def backend_for(cache, md, use_cpp: bool = False) -> PagedAttention:
    """The reference backend, or `accel`'s with the C++ kernel."""
    if not use_cpp:
        return PagedAttention(cache, md)
    from course_lib.accel.attention import CppPagedAttention

    return CppPagedAttention(cache, md, kernels())


def run_layer(seqs: list[tuple[int, int]], block_size: int = 4, num_blocks: int = 24, seed: int = 0,
              use_cpp: bool = False):
    """One attention layer over a packed step. seqs: (context_len, query_len) per sequence.

    Writes each sequence's earlier tokens into the cache first (as earlier steps would have), then
    runs the backend on the new tokens. Returns (paged out, expected out, cache, tables, full k).
    """
    torch.manual_seed(seed)
    cfg = tiny_config(num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS, hidden_size=HEADS * HEAD_DIM)
    cache = PagedKVCache(cfg, num_blocks=num_blocks, block_size=block_size)
    tables = shuffled_block_tables([c for c, _ in seqs], block_size, num_blocks, seed)
    full = [(torch.randn(1, c, HEADS, HEAD_DIM), torch.randn(1, c, KV_HEADS, HEAD_DIM),
             torch.randn(1, c, KV_HEADS, HEAD_DIM)) for c, _ in seqs]
    past = [(c - q) for c, q in seqs]
    if any(past):  # an earlier step stored the tokens before each chunk
        md_past = PagedAttentionMetadata.build(tables, past, past, block_size)
        PagedAttention(cache, md_past).attend(0, torch.cat([q[:, :p] for (q, _, _), p in zip(full, past)], 1),
                                              torch.cat([k[:, :p] for (_, k, _), p in zip(full, past)], 1),
                                              torch.cat([v[:, :p] for (_, _, v), p in zip(full, past)], 1))
    md = PagedAttentionMetadata.build(tables, [c for c, _ in seqs], [q for _, q in seqs], block_size)
    new = [tuple(t[:, p:] for t in qkv) for qkv, p in zip(full, past)]
    backend = backend_for(cache, md, use_cpp)
    out = backend.attend(0, *(torch.cat([n[i] for n in new], dim=1) for i in range(3)))
    expected = torch.cat([reference_attention(*qkv)[0][:, p:] for qkv, p in zip(full, past)], dim=1)
    return out, expected, cache, tables, [k for _, k, _ in full]


def test_paged_matches_causal_mixed_step():
    # full prefill, a chunk starting mid-sequence, two decodes (one of a 1-token context), a chunk at 0
    seqs = [(7, 7), (13, 5), (10, 1), (1, 1), (9, 4)]
    out, expected, cache, tables, ks = run_layer(seqs)
    assert out.shape == (1, sum(q for _, q in seqs), HEADS, HEAD_DIM)
    tolerance.assert_close(out, expected, 1e-5)
    for table, k, (ctx, _) in zip(tables, ks, seqs):  # every key landed in its paged slot
        stored = cache.k_cache[0][torch.tensor(table)].flatten(0, 1)[:ctx]
        torch.testing.assert_close(stored, k[0])


def test_paged_matches_causal_decode_only_and_block_size_one():
    out, expected, *_ = run_layer([(5, 1), (17, 1), (2, 1)])
    tolerance.assert_close(out, expected, 1e-5)
    out, expected, *_ = run_layer([(6, 3), (3, 1)], block_size=1, num_blocks=12)
    tolerance.assert_close(out, expected, 1e-5)


def random_decode_case(device: str, dtype: torch.dtype = torch.float32, context_lens=(1, 5, 16, 11), **shape):
    """q, caches and a shuffled, -1-padded block table for a batch of decodes (this file's default lengths)."""
    return random_decode_batch(context_lens, dtype=dtype, device=device, **shape)


def test_paged_decode_attention_matches_reference():
    q, k, v, bt, cl = random_decode_case("cpu")
    out = paged_decode_attention(q, k, v, bt, cl)  # [num_seqs, heads, head_dim]
    for i, ctx in enumerate(cl.tolist()):
        blocks = bt[i][bt[i] >= 0].long()
        keys, values = k[blocks].flatten(0, 1)[:ctx], v[blocks].flatten(0, 1)[:ctx]
        want = reference_attention(q[i][None, None], keys[None], values[None], start=ctx - 1)[0][0, 0]
        tolerance.assert_close(out[i], want, 1e-5)


TRITON_CASES = [dict(), dict(heads=4, kv_heads=4), dict(heads=8, kv_heads=1, head_dim=16, block_size=16,
                context_lens=(3, 40, 17)), dict(heads=6, kv_heads=2, head_dim=12, block_size=3, context_lens=(7, 1, 9))]


@pytest.mark.needs_cpp
def test_cpp_kernel_builds_where_a_toolchain_exists():
    """With a compiler and ninja the kernels must build: otherwise accel would fall back (with a warning) and the
    use_cpp tests would have nothing to test."""
    assert kernels() is not None


@pytest.mark.needs_cpp
@pytest.mark.parametrize("case", TRITON_CASES + [dict(heads=9, kv_heads=3, head_dim=64, context_lens=(5, 70, 33)),
                                                 dict(heads=8, kv_heads=2, head_dim=128, context_lens=(40, 1)),
                                                 # the vector kernel takes a group's heads up to 4 (head_dim 64)
                                                 # or 2 (128) at a time: groups of 7 and 5 leave remainders,
                                                 # contexts of 16, 17 and 32 fill a tile of 16 tokens or spill
                                                 dict(heads=14, kv_heads=2, head_dim=64, context_lens=(16, 17, 3)),
                                                 dict(heads=5, kv_heads=1, head_dim=128, context_lens=(32, 15)),
                                                 dict(heads=4, kv_heads=4, head_dim=64, context_lens=(1, 48))])
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cpp_decode_kernel_matches_torch(case, dtype, rtol):
    q, k, v, bt, cl = random_decode_case("cpu", dtype, **case)
    want = paged_decode_attention(q.double(), k.double(), v.double(), bt, cl)
    got = kernels().paged_decode_attention(q, k, v, bt, cl)
    assert got.dtype == dtype and got.shape == want.shape
    tolerance.assert_close(got.double(), want, rtol)


@pytest.mark.needs_cpp
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cpp_kernel_new_token_equals_storing_it_first(dtype, rtol):
    """k_new/v_new (the compiled step's token, not yet in the cache) on the vector path (head_dim 64), with
    contexts shorter and longer than the kernel's prefetch distance: the same as storing it, then attending.
    The cache slot the new token will take holds stale values, which the kernel must not read."""
    q, k, v, bt, cl = random_decode_case("cpu", dtype, heads=9, kv_heads=3, head_dim=64, context_lens=(5, 70, 33, 1))
    k_new, v_new = torch.randn(2, len(cl), 3, 64).to(dtype)
    stored_k, stored_v = k.clone(), v.clone()
    slots = [slots_for(table, [c - 1], k.shape[1])[0] for table, c in zip(bt.tolist(), cl.tolist())]  # position c - 1
    store_kvcache(k_new, v_new, stored_k, stored_v, torch.tensor(slots))
    want = paged_decode_attention(q.double(), stored_k.double(), stored_v.double(), bt, cl)
    got = kernels().paged_decode_attention(q, k, v, bt, cl - 1, k_new, v_new)
    tolerance.assert_close(got.double(), want, rtol)


@pytest.mark.needs_cpp
def test_cpp_kernel_takes_views_and_int64_tables():
    """A compiled graph calls the operator with q and the new K/V as views of the qkv matmul's output, and
    callers may pass int64 tables: the kernel makes them contiguous int32 itself, with the same result."""
    q, k, v, bt, cl = random_decode_case("cpu", torch.float32, heads=9, kv_heads=3, head_dim=64, context_lens=(5, 70))
    qkv = torch.randn(len(cl), 15, 64)  # [seqs, q + k + v heads, head_dim], as the fused projection lays them out
    qkv[:, :9] = q
    q_view, k_new, v_new = qkv.split([9, 3, 3], dim=1)
    assert not q_view.is_contiguous() and not k_new.is_contiguous()
    want = kernels().paged_decode_attention(q, k, v, bt, cl - 1, k_new.contiguous(), v_new.contiguous())
    for attend in (kernels().paged_decode_attention, torch.ops.course_lib.paged_decode_attention):
        torch.testing.assert_close(attend(q_view, k, v, bt.long(), (cl - 1).long(), k_new, v_new), want, rtol=0, atol=0)


@pytest.mark.needs_cpp
def test_cpp_kernel_refuses_context_lengths_it_cannot_attend():
    """A sequence with nothing to attend to (0 tokens, no new one) would divide by a zero sum; one longer than
    its block table would read memory past it. Both are refused with the sequence named, not computed."""
    q, k, v, bt, cl = random_decode_case("cpu", context_lens=(5, 3))
    for bad in ([5, 0], [5, bt.shape[1] * k.shape[1] + 1], [-1, 3]):
        with pytest.raises(RuntimeError, match=r"context_lens\[\d\] = "):
            kernels().paged_decode_attention(q, k, v, bt, torch.tensor(bad, dtype=torch.int32))
    k_new, v_new = torch.randn(2, 2, k.shape[2], k.shape[3])
    out = kernels().paged_decode_attention(q, k, v, bt, torch.tensor([5, 0]), k_new, v_new)  # 0 cached + 1 new
    torch.testing.assert_close(out[1], v_new[1].repeat_interleave(q.shape[1] // k.shape[2], 0))


@pytest.mark.needs_cpp
def test_cpp_kernel_in_the_backend_decode_and_mixed_steps():
    for seqs in ([(5, 1), (17, 1), (2, 1)], [(7, 7), (13, 5), (10, 1), (1, 1), (9, 4)]):  # decode only; mixed
        out, expected, *_ = run_layer(seqs, use_cpp=True)
        tolerance.assert_close(out, expected, 1e-5)


@pytest.mark.needs_cpp
def test_cpp_backend_sends_every_row_through_one_kernel_call(monkeypatch):
    """accel's prompt tokens are decode rows of the C++ kernel: a mixed step (a whole prompt, a later
    chunk, decodes, a chunk at 0) is one call, no PyTorch attention, and matches the plain path. SmolLM2's
    heads (9 of 64, 3 KV heads) take the vector kernel, whose rows are visited from both ends in turn."""
    seqs = [(70, 70), (40, 17), (33, 1), (1, 1), (19, 19), (90, 1)]
    cfg = tiny_config(num_layers=1, num_heads=9, num_kv_heads=3, hidden_size=9 * 64)
    torch.manual_seed(0)
    tables = shuffled_block_tables([c for c, _ in seqs], 16, 24, 0)
    full = [tuple(torch.randn(c, h, 64) for h in (9, 3, 3)) for c, _ in seqs]
    calls = []
    ops = kernels()

    class Spy:  # the extension, every kernel call recorded
        def paged_decode_attention(self, *a):
            calls.append(a)
            return ops.paged_decode_attention(*a)

    from course_lib.accel.attention import CppPagedAttention

    monkeypatch.setattr("course_lib.attention.paged.paged_prefill_attention", None)  # any call to it fails
    monkeypatch.setattr("course_lib.attention.paged.paged_decode_attention", None)
    cache = PagedKVCache(cfg, num_blocks=24, block_size=16)
    past = [c - q for c, q in seqs]
    CppPagedAttention(cache, PagedAttentionMetadata.build(tables, past, past, 16), Spy()).attend(
        0, *(torch.cat([t[i][:p] for t, p in zip(full, past)])[None] for i in range(3)))
    calls.clear()
    md = PagedAttentionMetadata.build(tables, [c for c, _ in seqs], [q for _, q in seqs], 16)
    out = CppPagedAttention(cache, md, Spy()).attend(
        0, *(torch.cat([t[i][p:] for t, p in zip(full, past)])[None] for i in range(3)))[0]
    assert len(calls) == 1 and calls[0][0].shape[0] == md.num_tokens
    assert calls[0][4].tolist() == [c - q + j + 1 for c, q in seqs for j in range(q)]  # what each row sees
    start = 0
    for (q, k, v), (ctx, n) in zip(full, seqs):
        want = reference_attention(q[None].double(), k[None].double(), v[None].double())[0][0, ctx - n:]
        tolerance.assert_close(out[start:start + n].double(), want, 1e-5)
        start += n


@pytest.mark.needs_cpp
def test_cpp_backend_rounds_bfloat16_prompts_once():
    """With a bfloat16 cache the C++ backend sums in float32 and rounds each output once: every row, prompts and
    decodes, within half a bfloat16 step of the float32 answer. PyTorch's bfloat16 attention (the plain path)
    rounds on the way and lands further off."""
    seqs = [(7, 7), (13, 5), (10, 1), (9, 4)]  # a whole prompt, a later chunk (keys read back), a decode, a chunk
    cfg = tiny_config(num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS, hidden_size=HEADS * HEAD_DIM)
    torch.manual_seed(0)
    tables = shuffled_block_tables([c for c, _ in seqs], 4, 24, 0)
    full = [tuple(torch.randn(c, h, HEAD_DIM).bfloat16() for h in (HEADS, KV_HEADS, KV_HEADS)) for c, _ in seqs]
    outs = {}
    for use_cpp in (False, True):
        cache = PagedKVCache(cfg, num_blocks=24, block_size=4, dtype=torch.bfloat16)
        past = [c - q for c, q in seqs]
        md = PagedAttentionMetadata.build(tables, past, past, 4)
        PagedAttention(cache, md).attend(0, *(torch.cat([t[i][:p] for t, p in zip(full, past)])[None] for i in range(3)))
        backend = backend_for(cache, PagedAttentionMetadata.build(tables, [c for c, _ in seqs],
                                                                  [q for _, q in seqs], 4), use_cpp)
        outs[use_cpp] = backend.attend(0, *(torch.cat([t[i][p:] for t, p in zip(full, past)])[None]
                                            for i in range(3)))[0]
    want = torch.cat([causal_attention(q[None, ctx - n:].float(), k[None].float(), v[None].float(), start=ctx - n)[0]
                      for (q, k, v), (ctx, n) in zip(full, seqs)])
    off = {use_cpp: ((out.float() - want).abs() / want.abs().clamp(min=1e-3)).max().item()  # relative
           for use_cpp, out in outs.items()}
    assert off[True] <= 2**-8 + 1e-5, off  # bfloat16 keeps 8 significant bits: rounding moves a value <= 2^-8 of it
    assert off[False] > off[True], off
    for out in outs.values():
        tolerance.assert_close(out.float(), want, 2e-2)


def check_triton_against_torch(device: str, dtype: torch.dtype = torch.float32, rtol: float = 1e-3) -> float:
    """Worst max |triton - torch| / max |torch| over the cases; raises if any exceeds rtol."""
    from course_lib.accel.triton_paged import triton_paged_decode_attention

    worst = 0.0
    for seed, case in enumerate(TRITON_CASES):
        q, k, v, bt, cl = random_decode_case(device, dtype, seed=seed, **case)
        want = paged_decode_attention(q, k, v, bt, cl).float()
        got = triton_paged_decode_attention(q, k, v, bt, cl).float()
        worst = max(worst, tolerance.assert_close(got, want, rtol, f"case {case}"))
    with pytest.raises(ValueError, match="int32"):
        triton_paged_decode_attention(q, k, v, bt.long(), cl)
    with pytest.raises(ValueError, match="contiguous"):
        k_strided = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # same shape, head_dim not contiguous
        triton_paged_decode_attention(q, k_strided, v, bt, cl)
    return worst


def test_triton_decode_kernel_matches_torch_interpreted(run_triton_interpreted):
    assert "triton max rel err" in run_triton_interpreted(__file__)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_decode_kernel_matches_torch_cuda():
    pytest.importorskip("triton")
    check_triton_against_torch("cuda")
    check_triton_against_torch("cuda", torch.bfloat16, rtol=2e-2)


def packed_step(model, cache, tables, work, seqs, block_size):
    """One engine-like step: work = [(seq index, start, end)] tokens to compute. Returns logits per entry."""
    ids = torch.tensor([t for i, s, e in work for t in seqs[i][s:e]])[None]  # [1, num_tokens]
    positions = torch.tensor([p for _, s, e in work for p in range(s, e)])[None]  # [1, num_tokens]
    md = PagedAttentionMetadata.build([tables[i] for i, _, _ in work], [e for _, _, e in work],
                                      [e - s for _, s, e in work], block_size)
    logits = model(ids, positions, kv=PagedAttention(cache, md))[0]  # [num_tokens, vocab]
    return logits.split([e - s for _, s, e in work])


@torch.no_grad()
def test_model_packed_batch_equals_each_sequence_alone():
    torch.manual_seed(0)
    cfg = tiny_config()
    model = Transformer(cfg).eval()
    seqs = [torch.randint(0, cfg.vocab_size, (n,)).tolist() for n in (12, 8, 10)]
    block_size = 4
    cache = PagedKVCache(cfg, num_blocks=16, block_size=block_size)
    tables = shuffled_block_tables([len(s) for s in seqs], block_size, 16)
    steps = [
        [(0, 0, 5), (1, 0, 6), (2, 0, 3)],  # prefill chunk, whole prompt, chunk
        [(0, 5, 11), (1, 6, 7), (2, 3, 9)],  # chunk from mid-sequence, decode, chunk
        [(0, 11, 12), (1, 7, 8), (2, 9, 10)],  # decodes only
    ]
    got = [dict() for _ in seqs]
    for work in steps:
        for (i, s, e), lg in zip(work, packed_step(model, cache, tables, work, seqs, block_size)):
            got[i].update({p: lg[p - s] for p in range(s, e)})
    for i, ids in enumerate(seqs):
        alone = model(torch.tensor(ids)[None])[0]  # [seq, vocab], kv=None
        paged = torch.stack([got[i][p] for p in range(len(ids))])
        tolerance.assert_close(paged, alone, 1e-4)


@torch.no_grad()
def test_model_shared_prefix_blocks():
    """A second sequence whose first 8 tokens sit in the first one's blocks computes only its tail."""
    torch.manual_seed(1)
    cfg = tiny_config()
    model = Transformer(cfg).eval()
    a = torch.randint(0, cfg.vocab_size, (11,)).tolist()
    b = a[:8] + torch.randint(0, cfg.vocab_size, (3,)).tolist()
    cache = PagedKVCache(cfg, num_blocks=8, block_size=4)
    tables = [[5, 2, 7], [5, 2, 0]]  # b shares a's two full blocks
    packed_step(model, cache, tables, [(0, 0, 11)], [a, b], 4)
    (tail,) = packed_step(model, cache, tables, [(1, 8, 11)], [a, b], 4)
    tolerance.assert_close(tail, model(torch.tensor(b)[None])[0, 8:], 1e-4)


if __name__ == "__main__":  # run by test_triton_decode_kernel_matches_torch_interpreted
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 to run the kernel on the CPU"
    print(f"triton max rel err {check_triton_against_torch('cpu'):.2e}")
