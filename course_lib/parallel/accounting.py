"""What one rank holds and what the ranks exchange: weights, KV cache, and bytes per token on the wire.

Per token of a forward, a tensor-parallel Transformer issues
    all-reduces:  2 per layer (after o_proj and after down_proj) + 1 (the vocab-parallel embedding),
                  each of hidden_size values
    all-gather:   1 per sampled position (the lm_head's logits), of vocab_size values (padded to tp x rows)
These are payload bytes (the tensor each rank hands to the collective); a ring all-reduce sends about
2 (tp - 1) / tp times its payload over each rank's link.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig


@dataclass(frozen=True)
class CommPerToken:
    all_reduces: int  # per forward token
    all_reduce_bytes: int  # per forward token
    all_gather_bytes: int  # per sampled token


def comm_per_token(config: ModelConfig, tp: int, dtype: torch.dtype) -> CommPerToken:
    """The formula: bytes each rank hands to the collectives per token (`config` is the full model's)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 2 * config.num_layers + 1
    padded_vocab = -(-config.vocab_size // tp) * tp
    return CommPerToken(n, n * config.hidden_size * itemsize, padded_vocab * itemsize)


def rank_weight_bytes(config: ModelConfig, tp: int, dtype: torch.dtype) -> int:
    """The formula for what `weight_bytes` finds on each rank of an unquantized model (`config`: the full one).

    Split by tp: q/o (num_heads / tp heads), gate/up/down (intermediate / tp), the vocabulary (padded rows).
    Replicated: the norms; k/v too when there are fewer KV heads than ranks (one KV head per rank).
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    h, d, L = config.hidden_size, config.head_dim, config.num_layers
    q, kv = config.num_heads // tp * d, max(config.num_kv_heads // tp, 1) * d
    bias = (q + 2 * kv) if config.attention_bias else 0
    per_layer = h * q * 2 + h * kv * 2 + bias + 3 * h * (config.intermediate_size // tp) + 2 * h
    vocab_rows = -(-config.vocab_size // tp)
    tables = 1 if config.tie_word_embeddings else 2
    rope = d // 2 * 4  # the float32 inv_freq buffer
    return (L * per_layer + h + tables * vocab_rows * h) * itemsize + rope
