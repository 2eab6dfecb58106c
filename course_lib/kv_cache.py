"""The contiguous KV cache: one preallocated [layers, batch, max_len, kv_heads, head_dim] slab.

Each decode step writes the new token's K and V at position `seq_len` and attends over
positions 0..seq_len: the step computes Q, K, V for one token instead of the whole prefix
(the trade: memory for compute, 以空间换时间). The engine's paged cache lives in
`course_lib.engine.block_manager` and `course_lib.attention.paged`.
"""
from __future__ import annotations

import torch

from .attention import causal_attention
from .config import ModelConfig


class KVCache:
    """Contiguous cache for `batch` sequences that grow in lockstep (one prompt, or equal-length prompts)."""

    def __init__(self, config: ModelConfig, max_seq_len: int, batch: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (config.num_layers, batch, max_seq_len, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_seq_len = max_seq_len
        self.seq_len = 0

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def attend(self, layer_idx, q, k, v):
        start, T = self.seq_len, q.shape[1]
        if start + T > self.max_seq_len:
            raise ValueError(f"KV cache full: {start} + {T} tokens > max_seq_len {self.max_seq_len}")
        self.k[layer_idx, :, start:start + T] = k
        self.v[layer_idx, :, start:start + T] = v
        keys = self.k[layer_idx, :, :start + T]  # [batch, start+T, kv_heads, head_dim]
        values = self.v[layer_idx, :, :start + T]
        return causal_attention(q, keys, values, start=start)

    def advance(self, num_tokens: int) -> None:
        self.seq_len += num_tokens

    def reset(self) -> None:
        self.seq_len = 0
