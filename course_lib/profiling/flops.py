"""FLOPs and bytes of one forward step, counted from the config: the x and y of a roofline.

A step runs `new_tokens` tokens for each of `batch` sequences whose caches already hold
`context_len` tokens: a prefill is (new_tokens=N, context_len=0), a decode step is
(new_tokens=1, context_len=C). A matmul [m, k] @ [k, n] costs 2*m*n*k FLOPs (a multiply
and an add per term). Per layer, with t = batch * new_tokens:

    q, o            2 t h (H d)        k, v        2 t h (KVH d)
    gate, up, down  2 t h I            attention   QK^T and AV: 2 H d per (query, key) pair each
and the lm_head 2 (batch * logits_tokens) h V. Norms, RoPE, softmax and SiLU are O(t h) and
left out, as `torch.utils.flop_counter` leaves them out.

Bytes moved are a lower bound on memory traffic: every weight read once per step, the KV
cache read once and the new K, V written, and each matmul's input and output read/written
once (as if elementwise ops were fused). Intensity = FLOPs / bytes: a decode step does
~2 FLOPs per weight per token of batch, so at batch 1 it is ~0.5 FLOP/byte in float32;
a prefill reuses every weight for all N tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .memory import ConfigLike, as_model_config, bytes_per_value


@dataclass
class StepCost:
    """FLOPs and bytes of one forward step, with the parts they are made of."""

    flops: int
    bytes: int
    flops_by_op: dict[str, int] = field(default_factory=dict)
    bytes_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes


def attention_pairs(new_tokens: int, context_len: int, causal: bool = True) -> int:
    """(query, key) pairs one head scores for one sequence.

    Causal: query i sits at position context_len + i and sees context_len + i + 1 keys.
    Dense: every query against all context_len + new_tokens keys, which is what a kernel
    that computes the full rectangle and masks it (and `FlopCounterMode`) counts.
    """
    if causal:
        return new_tokens * context_len + new_tokens * (new_tokens + 1) // 2
    return new_tokens * (context_len + new_tokens)


def step_flops(config: ConfigLike, batch: int = 1, new_tokens: int = 1, context_len: int = 0,
               logits_tokens: int | None = None, causal: bool = True) -> dict[str, int]:
    """Matmul FLOPs of one step by op, summed over layers: q_proj ... down_proj, attn_qk, attn_av, lm_head.

    `logits_tokens` is how many positions per sequence go through the lm_head (default all
    `new_tokens`; an engine's prefill needs only the last one).
    """
    c = as_model_config(config)
    t = batch * new_tokens
    h, i, L = c.hidden_size, c.intermediate_size, c.num_layers
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    pairs = batch * attention_pairs(new_tokens, context_len, causal)
    per_layer = {
        "q_proj": 2 * t * h * q, "k_proj": 2 * t * h * kv, "v_proj": 2 * t * h * kv, "o_proj": 2 * t * q * h,
        "attn_qk": 2 * c.num_heads * c.head_dim * pairs, "attn_av": 2 * c.num_heads * c.head_dim * pairs,
        "gate_proj": 2 * t * h * i, "up_proj": 2 * t * h * i, "down_proj": 2 * t * i * h,
    }
    out = {name: L * f for name, f in per_layer.items()}
    out["lm_head"] = 2 * batch * (new_tokens if logits_tokens is None else logits_tokens) * h * c.vocab_size
    return out


def step_bytes(config: ConfigLike, batch: int = 1, new_tokens: int = 1, context_len: int = 0,
               dtype: torch.dtype | str = torch.float32, kv_dtype: torch.dtype | str | None = None,
               weight_bytes: int | None = None, logits_tokens: int | None = None) -> dict[str, int]:
    """Bytes one step moves, by kind: weights, kv_read, kv_write, activations.

    Weights: every parameter once, except an untied input embedding, of which only the `t`
    looked-up rows are read. Pass `weight_bytes` for a quantized or otherwise measured model.
    """
    c = as_model_config(config)
    t = batch * new_tokens
    h, i, V = c.hidden_size, c.intermediate_size, c.vocab_size
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    act = bytes_per_value(dtype)
    if weight_bytes is None:
        params_read = c.num_parameters() - (0 if c.tie_word_embeddings else V * h)
        weight_bytes = params_read * act
    kv_token = 2 * c.num_layers * kv * bytes_per_value(kv_dtype or dtype)
    # Per token per layer: inputs + outputs of q,k,v (3 reads of x), o, gate/up (2 reads of x), down.
    per_token_layer = (3 * h + q + 2 * kv) + (q + h) + (2 * h + 2 * i) + (i + h)
    logits = batch * (new_tokens if logits_tokens is None else logits_tokens) * V
    return {
        "weights": weight_bytes,
        "kv_read": batch * (context_len + new_tokens) * kv_token,
        "kv_write": t * kv_token,
        "activations": (t * (c.num_layers * per_token_layer + h) + logits) * act,
    }


def step_cost(config: ConfigLike, batch: int = 1, new_tokens: int = 1, context_len: int = 0,
              dtype: torch.dtype | str = torch.float32, kv_dtype: torch.dtype | str | None = None,
              weight_bytes: int | None = None, logits_tokens: int | None = None,
              causal: bool = True) -> StepCost:
    """FLOPs, bytes and intensity of one forward step (see the module docstring for the model)."""
    flops = step_flops(config, batch, new_tokens, context_len, logits_tokens, causal)
    moved = step_bytes(config, batch, new_tokens, context_len, dtype, kv_dtype, weight_bytes, logits_tokens)
    return StepCost(sum(flops.values()), sum(moved.values()), flops, moved)


def prefill_cost(config: ConfigLike, num_tokens: int, batch: int = 1, **kwargs) -> StepCost:
    """A prefill of `num_tokens` prompt tokens per sequence into an empty cache."""
    return step_cost(config, batch=batch, new_tokens=num_tokens, context_len=0, **kwargs)


def decode_cost(config: ConfigLike, context_len: int, batch: int = 1, **kwargs) -> StepCost:
    """One decode step: one new token per sequence after `context_len` cached tokens."""
    return step_cost(config, batch=batch, new_tokens=1, context_len=context_len, **kwargs)
