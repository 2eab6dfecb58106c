"""A decoder block's elementwise steps in one pass each, for eager steps on the CPU (`csrc/fused_ops.cpp`).

    rms_norm(x, w, eps)             == w * F.rms_norm(x.float(), ...).to(x.dtype)    (`FusedRMSNorm`)
    add_rms_norm(x, y, w, eps)      == (x + y, rms_norm(x + y, w, eps))              residual add + next norm
    rope_qk_(qkv, cos, sin, ...)    == apply_rope on the q and k heads, in place     (`model.apply_rope`)
    silu_mul(gate_up)               == F.silu(gate) * up                             (SwiGLU's middle)

Eager PyTorch runs each of these as 5-8 kernels over a few thousand numbers, each a parallel region with its own
start-up cost. Each function takes `ext`, the built extension (or None), and uses it for CPU tensors of
`KERNEL_DTYPES` outside `torch.compile` (whose generated code fuses these itself); elsewhere it runs the PyTorch
expression on its right above, which is also what `tests/test_fused_ops.py` checks it against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import apply_rope

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64 (tests only) keeps PyTorch's arithmetic


def usable(ext, x: torch.Tensor):
    """`ext` where `x` can take it (a CPU tensor of `KERNEL_DTYPES` in an eager step), else None."""
    if ext is None or torch.compiler.is_compiling() or x.device.type != "cpu" or x.dtype not in KERNEL_DTYPES:
        return None
    return ext


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, ext=None) -> torch.Tensor:
    ext = usable(ext, x)
    if ext is None or weight.dtype != x.dtype:
        return reference_rms_norm(x, weight, eps)
    return ext.rms_norm(x.contiguous(), weight, eps)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, ext=None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y, rms_norm(x + y)): the residual stream after a sublayer, and the next sublayer's input."""
    ext = usable(ext, x)
    if ext is None or weight.dtype != x.dtype or y.dtype != x.dtype:
        s = x + y
        return s, reference_rms_norm(s, weight, eps)
    return tuple(ext.add_rms_norm(x.contiguous(), y.contiguous(), weight, eps))


def rope_qk_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
             head_dim: int, ext=None) -> torch.Tensor:
    """RoPE on the q and k heads of `qkv` [batch, seq, (heads + 2 kv_heads) * head_dim], in place; returns it.

    cos, sin [batch, seq, head_dim] as `RotaryEmbedding` gives them."""
    ext = usable(ext, qkv)
    if ext is None or not qkv.is_contiguous() or cos.dtype != qkv.dtype:
        B, T, _ = qkv.shape
        rotated = num_heads + num_kv_heads
        heads = qkv.view(B, T, -1, head_dim)
        heads[:, :, :rotated] = apply_rope(heads[:, :, :rotated], cos, sin)
        return qkv
    ext.rope_qk_(qkv, cos.contiguous(), sin.contiguous(), num_heads + num_kv_heads, head_dim)
    return qkv


def silu_mul(gate_up: torch.Tensor, ext=None) -> torch.Tensor:
    """silu(gate) * up, from gate_up [..., 2 * intermediate] with the gate first."""
    ext = usable(ext, gate_up)
    if ext is None:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    return ext.silu_mul(gate_up.contiguous())
