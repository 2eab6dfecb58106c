"""Quantized linear layers that multiply the codes without dequantizing the whole weight first, and
`use_quant_kernels`, which swaps them in for `QuantLinear`s (`LLM(accel=True, quantization=...)`).

  `OneDNNQuantLinear` (CPU)  PyTorch's packed weight-only kernels: `torch._weight_int8pack_mm` (INT8) and
            `torch._weight_int4pack_mm_for_cpu` (INT4), several times faster than dequantize-then-matmul for a
            decode step. They are fast only with bfloat16 activations, so the layer computes in bfloat16: x is cast
            to bf16 and y back to x's dtype (an error of about 2^-9 relative on top of the quantization error).
            INT4 weights are kept in the op's own packed layout (`torch._convert_weight_to_int4pack_for_cpu`, which
            depends on the CPU's vector width) *instead of* the portable one, so memory is not doubled;
            `dequantize` reads it back exactly (see `_int4_codes`). Both ops are built for a few rows: with many
            (a batch's decode step, a long prefill) the work is compute-bound and bfloat16 matmuls are faster. So
            from `INT8_DEQUANTIZE_ROWS` rows (INT8: the codes cast to bfloat16, the scale applied after) or from
            `INT4_DEQUANTIZE_ROWS` rows per input feature (INT4: its weight dequantized for the step) the layer
            multiplies in bfloat16. Timings: benchmarks/RESULTS.md.
  `TritonQuantLinear` (CUDA)  `triton_quant`, dequantizing inside the matmul, on the portable layout. Below compute
            capability 8.0 (a T4), where Triton's `tl.dot` has no tensor cores, up to 16 rows take a row kernel
            (multiply and sum) and more rows dequantize for cuBLAS (`triton_quant.choose_kernel`).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..quant.int4 import unpack_int4
from ..quant.linear import QuantLinear
from .linear import onednn_has_kernels

CPU_INT4_GROUP_SIZES = (32, 64, 128, 256)  # what `_weight_int4pack_mm_for_cpu` accepts
# Rows per (padded) input feature from which the INT4 layer dequantizes, then multiplies in bfloat16:
# where the matmul starts to beat the op (benchmarks/RESULTS.md, "INT4 and INT8 crossovers").
INT4_DEQUANTIZE_ROWS = 2.5
# Rows from which the INT8 layer multiplies its codes cast to bfloat16 (cheap: no unpacking) instead of
# calling the op: where that starts to beat the op over a whole decode step (same section).
INT8_DEQUANTIZE_ROWS = 24


def onednn_problem(method: str, in_features: int, out_features: int, group_size: int | None) -> str | None:
    """Why PyTorch's packed CPU ops cannot serve this layer, or None when they can."""
    if method == "int8":
        if not hasattr(torch, "_weight_int8pack_mm"):
            return "this torch has no torch._weight_int8pack_mm"
        if in_features % 16:  # torch 2.13: other widths give wrong results or crash
            return f"torch._weight_int8pack_mm needs in_features % 16 == 0, got {in_features}"
        return None
    if not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return "this torch has no torch._weight_int4pack_mm_for_cpu"
    if group_size not in CPU_INT4_GROUP_SIZES:
        return f"torch._weight_int4pack_mm_for_cpu needs group_size in {CPU_INT4_GROUP_SIZES}, got {group_size}"
    if out_features % 16:
        return f"torch._convert_weight_to_int4pack_for_cpu needs out_features % 16 == 0, got {out_features}"
    return None


class OneDNNQuantLinear(QuantLinear):
    """A CPU `QuantLinear` through PyTorch's packed weight-only ops. Built from a `QuantLinear` (`from_quant`).

    Buffers: int8 as `QuantLinear` but scales [out] bfloat16; int4 qweight [out, padded_in / 2] uint8 in the CPU
    op's layout, scale_zero [groups, out, 2] bfloat16, w = (code - 8) * scale + zero."""

    backend = "cpu"

    @classmethod
    def from_quant(cls, layer: QuantLinear) -> "OneDNNQuantLinear":
        """The same codes and scales, laid out for the ops (INT4's scales and mins rounded to bfloat16)."""
        problem = onednn_problem(layer.method, layer.in_features, layer.out_features, layer.group_size)
        if problem is not None:
            raise ValueError(f"{cls.__name__} cannot serve this {layer.out_features}x{layer.in_features} "
                             f"{layer.method} layer: {problem}")
        q = cls.__new__(cls)
        nn.Module.__init__(q)
        q.in_features, q.out_features, q.method, q.group_size = (layer.in_features, layer.out_features,
                                                                 layer.method, layer.group_size)
        q.register_buffer("qweight", layer.qweight if layer.method == "int8" else
                          torch._convert_weight_to_int4pack_for_cpu(unpack_int4(layer.qweight).to(torch.int32), 1))
        if layer.method == "int8":
            q.register_buffer("scales", layer.scales.to(torch.bfloat16))
        else:
            zero = layer.mins + 8 * layer.scales  # the op computes (code - 8) * scale + zero
            scale_zero = torch.stack([layer.scales, zero], dim=-1).transpose(0, 1)  # [groups, out, 2]
            q.register_buffer("scale_zero", scale_zero.to(torch.bfloat16).contiguous())  # the op reads it contiguous
        q.register_buffer("bias", layer.bias)
        return q

    def _apply(self, fn, recurse=True):
        """Stays on the CPU: the packed layout is the CPU op's (quantize again elsewhere)."""
        device = fn(torch.empty(0)).device
        if device.type not in ("cpu", "meta"):
            raise RuntimeError(f"a {type(self).__name__} cannot move to {device}: its layout is the CPU op's. "
                               f"Quantize the model again on {device}.")
        stored = {id(self._buffers[name]) for name in ("qweight", "scales", "scale_zero") if name in self._buffers}
        return nn.Module._apply(self, lambda t: t if id(t) in stored else fn(t), recurse)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.method == "int8":
            return super().dequantize(dtype)
        sz = self.scale_zero.float()  # [groups, out, 2]
        codes = self._int4_codes().view(self.out_features, sz.shape[0], self.group_size)  # [out, groups, G]
        scale, zero = sz[..., 0].t()[..., None], sz[..., 1].t()[..., None]  # [out, groups, 1] each
        w = (codes - 8) * scale + zero  # [out, groups, G]
        return w.reshape(self.out_features, -1)[:, : self.in_features].to(dtype)

    def _int4_codes(self) -> torch.Tensor:
        """The 4-bit codes [out, padded_in] as floats, read back from the CPU op's opaque layout.

        Multiplying the identity by the packed weight with scale 1 and zero 8 gives
        (code - 8) * 1 + 8 = code in every entry: small integers, exact in bfloat16.
        """
        unit = torch.zeros_like(self.scale_zero)
        unit[..., 0], unit[..., 1] = 1.0, 8.0
        return self._int4_weight_t(unit).t().float()  # [out, padded]

    def _int4_weight_t(self, scale_zero: torch.Tensor | None = None) -> torch.Tensor:
        """W^T [padded_in, out] in bfloat16 exactly as the CPU op dequantizes it (with this layer's scales and
        zeros, or `scale_zero`): the op applied to the identity."""
        eye = torch.eye(self.padded_in_features, dtype=torch.bfloat16, device=self.qweight.device)
        sz = self.scale_zero if scale_zero is None else scale_zero
        return torch._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group_size, sz)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [tokens, in]
        many = self.dequantizes_for(x2.shape[0])  # many rows: a bfloat16 matmul instead of the op
        if self.method == "int8":
            y = super().matmul(x2) if many else torch._weight_int8pack_mm(x2, self.qweight, self.scales)
        else:
            pad = self.padded_in_features - self.in_features
            if pad:
                x2 = F.pad(x2, (0, pad))  # [tokens, padded_in]: zeros meet the padding codes
            y = x2 @ self._int4_weight_t() if many else \
                torch._weight_int4pack_mm_for_cpu(x2, self.qweight, self.group_size, self.scale_zero)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)  # [..., out]

    def dequantizes_for(self, rows: int) -> bool:
        """True when this layer computes a step of `rows` rows as a bfloat16 matmul, not through the op.
        Never inside `torch.compile`: a branch on the rows there would make a graph for each side
        (`compiled_decode` gives compiled INT8 layers an operator that makes the same choice as the step runs)."""
        if torch.compiler.is_compiling() or not onednn_has_kernels(torch.bfloat16):
            return False
        if self.method == "int8":
            return rows >= INT8_DEQUANTIZE_ROWS
        return rows >= INT4_DEQUANTIZE_ROWS * self.padded_in_features


class TritonQuantLinear(QuantLinear):
    """A CUDA `QuantLinear` whose matmul dequantizes inside a Triton kernel (the same buffers)."""

    backend = "triton"

    @classmethod
    def from_quant(cls, layer: QuantLinear) -> "TritonQuantLinear":
        layer.__class__ = cls  # the portable layout is the kernels' own: nothing to copy
        return layer

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        from . import triton_quant  # importing triton decides once whether its kernels run interpreted

        if self.method == "int8":
            return triton_quant.int8_linear(x, self.qweight, self.scales)
        return triton_quant.int4_linear(x, self.qweight, self.scales, self.mins, self.in_features)


def use_quant_kernels(model: nn.Module, kernels: str) -> nn.Module:
    """Swap every `QuantLinear` of `model` for its `kernels` twin ("onednn" or "triton"; "torch" keeps them), in
    place; a layer the ops cannot serve stays pure PyTorch, with a warning naming it. Returns the model."""
    if kernels == "torch":
        return model
    twin = {"onednn": OneDNNQuantLinear, "triton": TritonQuantLinear}[kernels]
    fallbacks = []
    for name, layer in [(n, m) for n, m in model.named_modules() if type(m) is QuantLinear]:
        problem = onednn_problem(layer.method, layer.in_features, layer.out_features, layer.group_size) \
            if twin is OneDNNQuantLinear else None
        if problem is not None:
            fallbacks.append(f"{name} ({problem})")
            continue
        model.set_submodule(name, twin.from_quant(layer))
    if fallbacks:
        warnings.warn(f"use_quant_kernels: {len(fallbacks)} layer(s) stay on the slower PyTorch path: "
                      + "; ".join(fallbacks[:5]) + (" ..." if len(fallbacks) > 5 else ""), stacklevel=2)
    return model
