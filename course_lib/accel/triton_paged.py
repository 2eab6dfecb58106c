"""Triton kernels: decode attention over the paged KV cache (one query token per sequence), split along the
context (flash-decoding).

`_paged_decode_kernel` runs one program per (sequence, KV head, split). It loads the `group` query heads that
share this KV head, then walks its split's part of the sequence's block table: each K/V block is loaded once and
serves every query head of the group (GQA), and softmax is computed online, block by block (running max m,
running sum l, rescaled accumulator; Milakov & Gimelshein 2018, FlashAttention), so the context never has to sit
in memory at once. With `k_new`/`v_new` (a CUDA-graph decode step, which stores the step's K/V after its graph)
each sequence also attends to one token not yet in the cache, after its cached ones, as the twin does: the split
that holds the last cached block (split 0 for an empty context) counts it, so it is counted once.

Splits (flash-decoding; Dao et al. 2023, "Flash-Decoding for long-context inference"). One program per
(sequence, KV head) is 3 programs for the default model at batch 1: 3 of a card's 40 to 132 multiprocessors
busy, each walking the whole context. So the context is cut into `num_splits` runs of whole blocks, one program
each, and split s holds, for each query head,

    m_s = max_t score_t,   l_s = sum_t exp(score_t - m_s),   o_s = sum_t exp(score_t - m_s) v_t / l_s

over its tokens t, written as o_s and lse_s = m_s + log l_s (log-sum-exp; -inf for a split with no token).
`_combine_splits_kernel` merges them into the attention over the whole context:

    out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M),   M = max_s lse_s

which is the same online-softmax update once more, with a whole split in place of a token. With one split the
first kernel normalizes and stores the output itself, and nothing is combined: short decodes run as before.

The PyTorch twin is `course_lib.attention.paged.paged_decode_attention` (with `k_new`/`v_new`:
`accel.attention.decode_attention_with_new`); tests compare the two
under TRITON_INTERPRET=1 (which must be set before this module imports triton).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, k_new_ptr, v_new_ptr,
    part_out_ptr, part_lse_ptr,
    scale, max_blocks, min_blocks_per_split,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_os, stride_oh, stride_od,
    stride_bts, stride_btb,
    stride_kns, stride_knh, stride_vns, stride_vnh,
    stride_ps, stride_ph, stride_pp,  # part_out [num_seqs, heads, splits, head_dim], contiguous in head_dim
    stride_ls, stride_lh,  # part_lse [num_seqs, heads, splits], contiguous in splits
    HAS_NEW: tl.constexpr, SPLIT: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP_P2: tl.constexpr, HEAD_DIM_P2: tl.constexpr, BLOCK_P2: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    offs_g = tl.arange(0, GROUP_P2)  # query heads of this group (padded to a power of two)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    offs_t = tl.arange(0, BLOCK_P2)  # token offsets inside a block
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g

    q_ptrs = q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=mask_g[:, None] & mask_d[None, :], other=0.0).to(tl.float32)  # [G, D]
    q = q * scale

    ctx_len = tl.load(context_lens_ptr + seq)
    num_blocks = tl.minimum(tl.cdiv(ctx_len, BLOCK_SIZE), max_blocks)  # never past the block table
    # This sequence's blocks, shared out evenly among the splits, but at least min_blocks_per_split each (the
    # splits past a short context get none): [first, last) of this program.
    blocks_per_split = tl.maximum(tl.cdiv(num_blocks, num_splits), min_blocks_per_split)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    m_i = tl.full([GROUP_P2], float("-inf"), tl.float32)  # running max of the scores
    l_i = tl.zeros([GROUP_P2], tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)  # running sum of exp(score - m_i) * v
    for j in range(first, last):
        block_id = tl.load(block_tables_ptr + seq * stride_bts + j * stride_btb).to(tl.int64)
        pos = j * BLOCK_SIZE + offs_t
        mask_t = (offs_t < BLOCK_SIZE) & (pos < ctx_len)
        kv_mask = mask_t[:, None] & mask_d[None, :]
        k_ptrs = k_cache_ptr + block_id * stride_kb + offs_t[:, None] * stride_kt + kv_head * stride_kh \
            + offs_d[None, :] * stride_kd
        v_ptrs = v_cache_ptr + block_id * stride_vb + offs_t[:, None] * stride_vt + kv_head * stride_vh \
            + offs_d[None, :] * stride_vd
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0).to(tl.float32)  # [T, D]
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0).to(tl.float32)  # [T, D]

        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, T]
        s = tl.where(mask_t[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [G]
        alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old max
        p = tl.exp(s - m_new[:, None])  # [G, T]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [G, D]
        m_i = m_new

    # The step's own token, after the cached ones: one more online-softmax update, in the split that holds the
    # last cached block (split 0 when nothing is cached).
    if HAS_NEW:
        if split == tl.maximum(num_blocks - 1, 0) // blocks_per_split:
            k_n = tl.load(k_new_ptr + seq * stride_kns + kv_head * stride_knh + offs_d, mask=mask_d,
                          other=0.0).to(tl.float32)  # [D]
            v_n = tl.load(v_new_ptr + seq * stride_vns + kv_head * stride_vnh + offs_d, mask=mask_d,
                          other=0.0).to(tl.float32)  # [D]
            s_n = tl.sum(q * k_n[None, :], axis=1)  # [G]
            m_new = tl.maximum(m_i, s_n)
            alpha = tl.exp(m_i - m_new)
            p_n = tl.exp(s_n - m_new)  # [G]
            l_i = l_i * alpha + p_n
            acc = acc * alpha[:, None] + p_n[:, None] * v_n[None, :]
            m_i = m_new

    mask_gd = mask_g[:, None] & mask_d[None, :]
    if SPLIT:  # this split's normalized output and log-sum-exp, for the combine
        has_any = l_i > 0  # [G]; false for a split past the end of a short context
        out = acc / tl.where(has_any, l_i, 1.0)[:, None]  # [G, D]; zeros for an empty split
        lse = tl.where(has_any, m_i + tl.log(tl.where(has_any, l_i, 1.0)), float("-inf"))  # [G]
        part_ptrs = part_out_ptr + seq * stride_ps + heads[:, None] * stride_ph + split * stride_pp + offs_d[None, :]
        tl.store(part_ptrs, out, mask=mask_gd)
        tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=mask_g)
    else:
        out = acc / l_i[:, None]  # [G, D]
        out_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_gd)


@triton.jit
def _combine_splits_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, num_splits,
    stride_os, stride_oh, stride_od,
    stride_ps, stride_ph, stride_pp,
    stride_ls, stride_lh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
):
    """One program per (sequence, query head): out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M), computed
    online over the splits. Split 0 always holds a token (the first block, or the new token): it starts the sums
    (weight exp(0) = 1), the running max is finite from there on, and an empty split (lse -inf) adds 0."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    mask_d = offs_d < HEAD_DIM
    o_ptrs = part_out_ptr + seq * stride_ps + head * stride_ph + offs_d  # split 0's o, [D]
    lse_ptr = part_lse_ptr + seq * stride_ls + head * stride_lh  # split 0's lse
    m_i = tl.load(lse_ptr)  # running max of the splits' lse
    l_i = tl.full([], 1.0, tl.float32)  # running sum of exp(lse_s - m_i)
    acc = tl.load(o_ptrs, mask=mask_d, other=0.0)  # [D], running sum of exp(lse_s - m_i) * o_s
    for s in range(1, num_splits):
        lse = tl.load(lse_ptr + s)
        o = tl.load(o_ptrs + s * stride_pp, mask=mask_d, other=0.0)  # [D]
        m_new = tl.maximum(m_i, lse)
        alpha = tl.exp(m_i - m_new)
        w = tl.exp(lse - m_new)
        l_i = l_i * alpha + w
        acc = acc * alpha + w * o
        m_i = m_new
    out = acc / l_i  # [D]
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=mask_d)


# A split holds at least this many tokens, so a short context keeps one split: one launch, and no partial results
# to write and combine. vLLM's PagedAttention V2 cuts contexts into partitions of 512 tokens too (`PARTITION_SIZE`
# in its csrc/attention/paged_attention_v2.cu, `_PARTITION_SIZE` on the Python side).
MIN_SPLIT_TOKENS = 512


def num_splits_for(num_seqs: int, kv_heads: int, max_blocks: int, block_size: int, num_sms: int = 132) -> int:
    """How many splits of the context a decode launch uses, from shapes only (so a CUDA graph can capture it and a
    CPU can answer): enough (sequence, KV head, split) programs to give each of `num_sms` multiprocessors one
    (132 on an H100 SXM; a smaller card runs the extra programs in a second wave), each split at least
    MIN_SPLIT_TOKENS of the widest block table (so a context under 2 * 512 tokens keeps 1 split), and never more
    splits than blocks. 1 when the batch alone fills the card (or the table has no block: the new token only)."""
    if min(num_seqs, kv_heads, block_size, num_sms) < 1 or max_blocks < 0:
        raise ValueError(f"need positive sizes, got num_seqs={num_seqs}, kv_heads={kv_heads}, "
                         f"max_blocks={max_blocks}, block_size={block_size}, num_sms={num_sms}")
    to_fill = -(-num_sms // (num_seqs * kv_heads))  # splits that give every multiprocessor a program
    by_length = max_blocks * block_size // MIN_SPLIT_TOKENS  # splits of at least MIN_SPLIT_TOKENS
    return max(1, min(to_fill, by_length, max_blocks))


_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def triton_paged_decode_attention(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
                                  out: torch.Tensor | None = None, num_sms: int = 132,
                                  num_splits: int | None = None) -> torch.Tensor:
    """Same contract as `paged_decode_attention`, on the GPU (or the Triton interpreter).

    q [num_seqs, heads, head_dim]; k/v_cache_layer [num_blocks, block_size, kv_heads, head_dim];
    block_tables [num_seqs, max_blocks] int32; context_lens [num_seqs] int32, each in
    [1, max_blocks * block_size] ([0, ...] with k_new, v_new [num_seqs, kv_heads, head_dim]: one more token
    each, not in the cache). Returns (or fills `out`) [num_seqs, heads, head_dim] in q's dtype.
    Checks shapes only: it reads no tensor's values, so a CUDA graph can capture it.

    The context is split `num_splits_for(num_seqs, kv_heads, max_blocks, block_size, num_sms)` ways (1 for short
    contexts); `num_splits` forces a count instead (tests, benchmarks), in [1, max(max_blocks, 1)], each split then
    holding at least one block.
    """
    if q.dim() != 3 or k_cache_layer.dim() != 4:
        raise ValueError(f"need q [num_seqs, heads, head_dim] and k_cache_layer "
                         f"[num_blocks, block_size, kv_heads, head_dim], got {tuple(q.shape)} and "
                         f"{tuple(k_cache_layer.shape)}")
    if v_cache_layer.shape != k_cache_layer.shape:
        raise ValueError(f"k and v caches differ in shape: {tuple(k_cache_layer.shape)} vs {tuple(v_cache_layer.shape)}")
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, kv_heads, cache_head_dim = k_cache_layer.shape
    if cache_head_dim != head_dim or num_heads % kv_heads:
        raise ValueError(f"q has {num_heads} heads of {head_dim}; the cache {kv_heads} KV heads of "
                         f"{cache_head_dim}: need equal head_dim and heads a multiple of kv_heads")
    if q.dtype not in _DTYPES or k_cache_layer.dtype != q.dtype or v_cache_layer.dtype != q.dtype:
        raise TypeError(f"q, k_cache, v_cache must share one of {_DTYPES}, got "
                        f"{q.dtype}, {k_cache_layer.dtype}, {v_cache_layer.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32 [num_seqs={num_seqs}, max_blocks], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.shape != (num_seqs,) or context_lens.dtype != torch.int32:
        raise ValueError(f"context_lens must be int32 [num_seqs={num_seqs}], got "
                         f"{context_lens.dtype} {tuple(context_lens.shape)}")
    for name, t in (("q", q), ("k_cache_layer", k_cache_layer), ("v_cache_layer", v_cache_layer)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1), got strides {t.stride()}")
    if (k_new is None) != (v_new is None):
        raise ValueError("pass k_new and v_new together, or neither")
    if k_new is not None:
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if t.shape != (num_seqs, kv_heads, head_dim) or t.dtype != q.dtype or t.stride(-1) != 1:
                raise ValueError(f"{name} must be {q.dtype} [{num_seqs}, {kv_heads}, {head_dim}] contiguous in "
                                 f"head_dim, got {t.dtype} {tuple(t.shape)} strides {t.stride()}")
    tensors = (q, k_cache_layer, v_cache_layer, block_tables, context_lens) + ((k_new, v_new) if k_new is not None
                                                                              else ())
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"all inputs must be on one device, got {[str(t.device) for t in tensors]}")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 set before importing "
                           "triton); on the CPU use course_lib.attention.paged.paged_decode_attention")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q: {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if num_seqs == 0:
        return out

    max_blocks = block_tables.shape[1]
    if num_splits is None:
        num_splits = num_splits_for(num_seqs, kv_heads, max_blocks, block_size, num_sms)
        min_blocks_per_split = -(-MIN_SPLIT_TOKENS // block_size)
    elif not 1 <= num_splits <= max(max_blocks, 1):
        raise ValueError(f"num_splits must be in [1, {max(max_blocks, 1)}] (the block table's width), got {num_splits}")
    else:
        min_blocks_per_split = 1
    if num_splits > 1:  # each split's output [.., head_dim] and log-sum-exp, float32, for the combine
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out, part_lse = out, out  # unread stand-ins

    group = num_heads // kv_heads
    grid = (num_seqs, kv_heads, num_splits)
    _paged_decode_kernel[grid](
        out, q, k_cache_layer, v_cache_layer, block_tables, context_lens,
        q if k_new is None else k_new, q if v_new is None else v_new,  # q: an unread stand-in
        part_out, part_lse,
        head_dim ** -0.5, max_blocks, min_blocks_per_split,
        *q.stride(), *k_cache_layer.stride(), *v_cache_layer.stride(), *out.stride(), *block_tables.stride(),
        *(k_new.stride()[:2] + v_new.stride()[:2] if k_new is not None else (0, 0, 0, 0)),
        *part_out.stride()[:3], *part_lse.stride()[:2],
        HAS_NEW=k_new is not None, SPLIT=num_splits > 1,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        GROUP_P2=triton.next_power_of_2(group), HEAD_DIM_P2=triton.next_power_of_2(head_dim),
        BLOCK_P2=triton.next_power_of_2(block_size),
        enable_fp_fusion=True,  # a*b+c as one FMA, stated: Triton 3.10 changes the default to off
    )
    if num_splits > 1:
        _combine_splits_kernel[(num_seqs, num_heads)](
            out, part_out, part_lse, num_splits, *out.stride(), *part_out.stride()[:3], *part_lse.stride()[:2],
            HEAD_DIM=head_dim, HEAD_DIM_P2=triton.next_power_of_2(head_dim), enable_fp_fusion=True,
        )
    return out
