"""Online softmax: the running-max trick behind FlashAttention, in plain PyTorch.

softmax(s)_j = exp(s_j - m) / sum_k exp(s_k - m) needs the row maximum m and the sum before any
output can be written. The online form reads the scores one block at a time and keeps three running
quantities per query row: the max m seen so far, the sum l of exp(s - m), and the output
accumulator acc = sum_j exp(s_j - m) v_j. When a new block raises the max from m to m', the old l and
acc are rescaled by exp(m - m'). After the last block, out = acc / l. The full [queries, keys] score
matrix never exists at once: only one [queries, block] tile (Milakov & Gimelshein 2018; Dao et al. 2022).

These are teaching versions: a Python loop over key blocks, exact in float32, not fast.
"""
from __future__ import annotations

import torch


def online_softmax(x: torch.Tensor, block_size: int = 4) -> torch.Tensor:
    """softmax over the last dim of x: one blocked pass keeps the running max m and sum l = sum exp(x - m), a
    second writes exp(x - m) / l. Equal to `x.softmax(-1)` up to float rounding."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=torch.float32, device=x.device)  # [..., 1]
    l = torch.zeros_like(m)  # [..., 1]
    xf = x.float()
    for j in range(0, x.shape[-1], block_size):
        block = xf[..., j:j + block_size]  # [..., block]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        l = l * _exp_diff(m, m_new) + _exp_diff(block, m_new).sum(-1, keepdim=True)
        m = m_new
    return (_exp_diff(xf, m) / l).to(x.dtype)


def online_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64,
                             start: int = 0, causal: bool = True) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) [+ causal mask]) V, one block of keys at a time (FlashAttention's loop), laid out
    as `causal_attention`: q [B, Tq, H, D], k, v [B, Tk, KVH, D] (GQA: query head h reads KV head h // (H // KVH)),
    query i at position start + i. Returns [B, Tq, H, D]."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    B, Tq, H, D = q.shape
    Tk, KVH = k.shape[1], k.shape[2]
    if H % KVH:
        raise ValueError(f"query heads ({H}) must be a multiple of KV heads ({KVH})")
    group = H // KVH
    qf = q.transpose(1, 2).float() * D ** -0.5  # [B, H, Tq, D], scaled once
    kf = k.repeat_interleave(group, dim=2).transpose(1, 2).float()  # [B, H, Tk, D]
    vf = v.repeat_interleave(group, dim=2).transpose(1, 2).float()  # [B, H, Tk, D]
    qpos = torch.arange(start, start + Tq, device=q.device)[:, None]  # [Tq, 1]

    m = torch.full((B, H, Tq, 1), float("-inf"), device=q.device)  # running max of the scores
    l = torch.zeros(B, H, Tq, 1, device=q.device)  # running sum of exp(score - m)
    acc = torch.zeros(B, H, Tq, D, device=q.device)  # running sum of exp(score - m) * v
    for j in range(0, Tk, block_size):
        if causal and j > start + Tq - 1:
            break  # every later key is in the future of every query: skip the rest
        s = qf @ kf[:, :, j:j + block_size].transpose(-1, -2)  # [B, H, Tq, block]
        if causal:
            kpos = torch.arange(j, j + s.shape[-1], device=q.device)[None, :]  # [1, block]
            s = s.masked_fill(kpos > qpos, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))  # [B, H, Tq, 1]
        p = _exp_diff(s, m_new)  # [B, H, Tq, block]
        rescale = _exp_diff(m, m_new)  # how much the old max overestimated: exp(m - m_new) <= 1
        l = l * rescale + p.sum(-1, keepdim=True)
        acc = acc * rescale + p @ vf[:, :, j:j + block_size]  # [B, H, Tq, D]
        m = m_new
    out = acc / l  # [B, H, Tq, D]; l > 0 since every query sees at least key 0
    return out.transpose(1, 2).to(q.dtype)  # [B, Tq, H, D]


def _exp_diff(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """exp(x - m), with exp(-inf - -inf) taken as 0 (a row that has seen only masked scores so far)."""
    return torch.exp(x - torch.where(torch.isinf(m), torch.zeros_like(m), m))
