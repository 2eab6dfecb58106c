"""A faster model for the engine: the same blocks with fewer, larger operations.

    model = load_model(...)
    use_fast_path(model)     # per block: q/k/v -> one qkv_proj, gate/up -> one gate_up_proj, fused RMSNorm

`course_lib.model` stays the readable reference. Each class here subclasses one of its modules and
changes only how it computes the same numbers (for attention, only `project_qkv`): one matmul reads
the weights of three (or two) and writes one output, and the RMSNorm is PyTorch's fused kernel
instead of six elementwise ops. `tests/test_fast_path.py` checks logits and greedy tokens against the reference model.
The separate projections are removed (not kept as copies), so a fused model holds no extra
memory; code that reads `q_proj` by name (the early chapters) uses the reference model.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import MLP, Attention, RMSNorm, Transformer


class FusedRMSNorm(RMSNorm):
    """RMSNorm with `F.rms_norm` (one kernel), still in float32 as Llama does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class FusedAttention(Attention):
    """Attention whose q, k and v come from one matmul with the three weights stacked: [q + 2 kv, hidden]."""

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        return (q.view(B, T, self.num_heads, self.head_dim), k.view(B, T, self.num_kv_heads, self.head_dim),
                v.view(B, T, self.num_kv_heads, self.head_dim))


class FusedMLP(MLP):
    """SwiGLU whose gate and up projections are one matmul: [2 * intermediate, hidden]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def stack_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the outputs of `linears` side by side (weights and biases stacked)."""
    weight = torch.cat([lin.weight.data for lin in linears])  # [sum of outputs, in_features]
    has_bias = linears[0].bias is not None
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device=weight.device, dtype=weight.dtype)
    fused.weight.data = weight
    if has_bias:
        fused.bias.data = torch.cat([lin.bias.data for lin in linears])
    return fused


def use_fast_path(model: Transformer) -> Transformer:
    """Turn every block of `model` into its fused twin, in place; returns the model. Call before quantizing."""
    for block in model.layers:
        attn, mlp = block.self_attn, block.mlp
        if type(attn) is Attention:
            attn.qkv_proj = stack_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            del attn.q_proj, attn.k_proj, attn.v_proj
            attn.__class__ = FusedAttention
        if type(mlp) is MLP:
            mlp.gate_up_proj = stack_linears([mlp.gate_proj, mlp.up_proj])
            del mlp.gate_proj, mlp.up_proj
            mlp.__class__ = FusedMLP
        for norm in (block.input_layernorm, block.post_attention_layernorm):
            if type(norm) is RMSNorm:
                norm.__class__ = FusedRMSNorm
    if type(model.norm) is RMSNorm:
        model.norm.__class__ = FusedRMSNorm
    return model

