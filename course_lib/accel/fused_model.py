"""The fused twin of the model: the same blocks with fewer, larger operations.

`course_lib.model` stays the readable reference. Each class here subclasses one of its modules and changes only
how it computes the same numbers: one matmul reads the weights of three (or two) and writes one output, and the
elementwise steps (RMSNorm, the residual add before the second norm, RoPE, SiLU*up) each take one pass
(`fused_ops`: the C++ kernels in eager CPU steps when built, PyTorch's expression elsewhere).
`tests/test_fused_model.py` checks logits and greedy tokens against the reference model. The separate
projections are removed (not kept as copies), so a fused model holds no extra memory; code that reads
`q_proj` by name (the early chapters) uses the reference model.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..attention import causal_attention
from ..model import MLP, Attention, Block, RMSNorm, Transformer
from . import fused_ops


class FusedRMSNorm(RMSNorm):
    """RMSNorm in one pass, in float32. `ops`: the built extension, or None (PyTorch's `F.rms_norm`)."""

    ops = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_ops.rms_norm(x, self.weight, self.eps, self.ops)


class FusedAttention(Attention):
    """Attention whose q, k and v come from one matmul with the three weights stacked: [q + 2 kv, hidden].

    With the kernels, RoPE rotates q and k in place in that matmul's output, in one pass."""

    ops = None

    def forward(self, x, cos, sin, kv=None) -> torch.Tensor:
        if fused_ops.usable(self.ops, x) is None:
            return super().forward(x, cos, sin, kv)  # project_qkv, then model.apply_rope
        B, T, _ = x.shape
        qkv = fused_ops.rope_qk_(self.qkv_proj(x), cos, sin, self.num_heads, self.num_kv_heads, self.head_dim,
                                 self.ops)
        q, k, v = self.split_qkv(qkv)
        out = causal_attention(q, k, v) if kv is None else kv.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(B, T, self.num_heads * self.head_dim))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.split_qkv(self.qkv_proj(x))

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [batch, seq, q + 2 kv] -> views q [batch, seq, heads, head_dim], k and v [.., kv_heads, ..]."""
        B, T, _ = qkv.shape
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return (q.view(B, T, self.num_heads, self.head_dim), k.view(B, T, self.num_kv_heads, self.head_dim),
                v.view(B, T, self.num_kv_heads, self.head_dim))


class FusedMLP(MLP):
    """SwiGLU whose gate and up projections are one matmul: [2 * intermediate, hidden]."""

    ops = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused_ops.silu_mul(self.gate_up_proj(x), self.ops))


class FusedBlock(Block):
    """A block whose residual add and post-attention RMSNorm are one pass (`fused_ops.add_rms_norm`)."""

    ops = None

    def forward(self, x, cos, sin, kv=None) -> torch.Tensor:
        norm = self.post_attention_layernorm
        x, h = fused_ops.add_rms_norm(x, self.self_attn(self.input_layernorm(x), cos, sin, kv), norm.weight,
                                      norm.eps, self.ops)
        return x + self.mlp(h)


def stack_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the outputs of `linears` side by side (weights and biases stacked)."""
    weight = torch.cat([lin.weight.data for lin in linears])  # [sum of outputs, in_features]
    has_bias = linears[0].bias is not None
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device=weight.device, dtype=weight.dtype)
    fused.weight.data = weight
    if has_bias:
        fused.bias.data = torch.cat([lin.bias.data for lin in linears])
    return fused


def fuse_model(model: Transformer, ops=None) -> Transformer:
    """Turn every block of `model` into its fused twin, in place; returns the model. Call before quantizing.

    `ops`: the built extension (`build.build().module`) for the elementwise steps of eager CPU steps, or None."""
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
        if type(block) is Block:
            block.__class__ = FusedBlock
    if type(model.norm) is RMSNorm:
        model.norm.__class__ = FusedRMSNorm
    for module in model.modules():
        if isinstance(module, (FusedRMSNorm, FusedAttention, FusedMLP, FusedBlock)):
            module.ops = ops
    return model
