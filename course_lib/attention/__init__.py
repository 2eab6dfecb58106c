"""Attention backends. The model calls one interface; each backend decides where K/V live.

- `causal_attention`: plain full causal attention with PyTorch's fused `scaled_dot_product_attention`.
- `ReferenceAttention`: explicit softmax(QK^T/sqrt(d))V that keeps the weights for plotting.
- `course_lib.kv_cache.KVCache`: a contiguous cache for one batch of equal-length sequences.
- `course_lib.attention.paged`: attention through block tables over a paged cache (the engine).

A backend passed to `Transformer.forward(kv=...)` implements `AttentionBackend`.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class AttentionBackend(Protocol):
    seq_len: int  # tokens already stored: where the next forward's positions start

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [batch, seq, heads, head_dim], k/v [batch, seq, kv_heads, head_dim] -> [batch, seq, heads, head_dim]."""

    def advance(self, num_tokens: int) -> None:
        """Called once per forward after the last layer."""


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Causal GQA attention. q [B, Tq, H, D]; k, v [B, Tk, KVH, D]; query i at position start + i sees keys
    0..start+i. Returns [B, Tq, H, D]. Never a mask together with GQA (only the math kernel takes both, writing out
    every score): FlashAttention takes GQA but no mask, the memory-efficient kernel a mask but no GQA."""
    Tq, Tk = q.shape[1], k.shape[1]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, seq, head_dim]
    gqa = q.shape[1] != k.shape[1]
    if start == 0 and Tq == Tk:  # a whole prompt
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    elif Tq == 1 and start == Tk - 1:  # one query after all its keys: it sees every one
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    else:  # a chunk after cached tokens
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, heads, Tk, head_dim]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(Tq, Tk, start, q.device))
    return out.transpose(1, 2)  # [B, Tq, H, D]


def causal_mask(num_queries: int, num_keys: int, start: int, device=None) -> torch.Tensor:
    """Boolean [Tq, Tk]: True where query i (at position start + i) may look at key j."""
    qpos = torch.arange(start, start + num_queries, device=device)[:, None]
    kpos = torch.arange(num_keys, device=device)[None, :]
    return kpos <= qpos


class ReferenceAttention:
    """No cache; explicit softmax so the weights can be inspected: after `model(ids, kv=ref)`,
    `ref.weights[layer]` is [batch, heads, seq, seq]."""

    def __init__(self, keep_weights: bool = True):
        self.keep_weights = keep_weights
        self.weights: dict[int, torch.Tensor] = {}
        self.seq_len = 0

    def attend(self, layer_idx, q, k, v):
        out, w = reference_attention(q, k, v)
        if self.keep_weights:
            self.weights[layer_idx] = w.detach()
        return out

    def advance(self, num_tokens: int) -> None:
        pass  # stores nothing: every forward starts at position 0


def reference_attention(q, k, v, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d) + causal mask) V, written out. Returns (out [B,Tq,H,D], weights [B,H,Tq,Tk])."""
    dtype, group = q.dtype, q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))  # each KV head serves `group` query heads
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))  # [B, heads, seq, head_dim]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [B, heads, Tq, Tk]
    mask = causal_mask(q.shape[2], k.shape[2], start, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    out = weights @ v  # [B, heads, Tq, head_dim]
    return out.transpose(1, 2).to(dtype), weights
