"""`QuantLinear`, a drop-in for `nn.Linear` with INT8 or INT4 weights, and `quantize_model`.

The model file never learns that quantization exists: `quantize_model` walks the model and
swaps each `nn.Linear` for a `QuantLinear` holding the same weight as codes plus scales.

Backends, chosen once per layer when it is built (`backend="auto"` picks by the weight's device):

  "torch"   the reference, any device: dequantize, then `F.linear` in x's dtype. INT8 keeps its
            per-row scale out of the matmul: y = F.linear(x, codes) * scale.
  "cpu"     PyTorch's packed weight-only CPU kernels: `torch._weight_int8pack_mm` (INT8) and
            `torch._weight_int4pack_mm_for_cpu` (INT4), several times faster than dequantize-then-matmul
            for a decode step. They are fast only with bfloat16 activations, so this backend computes in
            bfloat16: x is cast to bf16 and y back to x's dtype (an error of about 2^-9 relative on top
            of the quantization error). INT4 weights are kept in the op's own packed layout
            (`torch._convert_weight_to_int4pack_for_cpu`, which depends on the CPU's vector width)
            *instead of* the portable one, so memory is not doubled; `dequantize` reads it back exactly
            (see `_cpu_int4_codes`). Both ops are built for a few rows: with many (a batch's decode step,
            a long prefill) the work is compute-bound and bfloat16 matmuls are faster. So from
            `INT8_DEQUANTIZE_ROWS` rows (INT8: the codes cast to bfloat16, the scale applied after) or
            from `INT4_DEQUANTIZE_ROWS` rows per input feature (INT4: its weight dequantized for the
            step) the layer multiplies in bfloat16. Timings: benchmarks/RESULTS.md.
  "triton"  CUDA: `triton_kernels`, dequantizing inside the matmul, on the portable layout. Below compute
            capability 8.0 (a T4), where Triton's `tl.dot` has no tensor cores, up to 16 rows take a row
            kernel (multiply and sum) and more rows dequantize for cuBLAS (`triton_kernels.choose_kernel`).
"""
from __future__ import annotations

import copy
import importlib.util
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..dtypes import onednn_has_kernels
from .int4 import dequantize_int4, padded_in_features, quantize_int4, unpack_int4
from .int8 import dequantize_int8, quantize_int8

METHODS = ("int8", "int4")
BACKENDS = ("torch", "cpu", "triton")
CPU_INT4_GROUP_SIZES = (32, 64, 128, 256)  # what `_weight_int4pack_mm_for_cpu` accepts
# Rows per (padded) input feature from which the "cpu" INT4 layer dequantizes, then multiplies in bfloat16:
# where the matmul starts to beat the op (benchmarks/RESULTS.md, "INT4 and INT8 crossovers").
INT4_DEQUANTIZE_ROWS = 2.5
# Rows from which the "cpu" INT8 layer multiplies its codes cast to bfloat16 (cheap: no unpacking) instead of
# calling the op: where that starts to beat the op over a whole decode step (same section).
INT8_DEQUANTIZE_ROWS = 24


def cpu_backend_problem(method: str, in_features: int, out_features: int, group_size: int) -> str | None:
    """Why the "cpu" backend cannot serve this layer, or None when it can."""
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


def choose_backend(backend: str, device: torch.device, method: str, in_features: int, out_features: int,
                   group_size: int) -> tuple[str, str | None]:
    """Resolve "auto" to a backend for this layer; returns (backend, why "auto" fell back to "torch" or None)."""
    if backend not in BACKENDS + ("auto",):
        raise ValueError(f"backend must be one of {BACKENDS + ('auto',)}, got {backend!r}")
    problem = cpu_backend_problem(method, in_features, out_features, group_size) if device.type == "cpu" else \
        f"the weight is on {device}, not the CPU"
    if backend == "cpu" and problem:
        raise ValueError(f"backend='cpu' cannot serve this {out_features}x{in_features} {method} layer: {problem}")
    if backend != "auto":
        return backend, None
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return "triton", None
    if device.type == "cpu" and problem is None:
        return "cpu", None
    return "torch", problem if device.type == "cpu" else "triton is not installed"


class QuantLinear(nn.Module):
    """y = x @ W^T + b with W stored as INT8 (per output channel) or INT4 (group-wise) codes.

    The backend is fixed when the layer is built (the "cpu" INT4 layout only the CPU op reads):
    move the float model to its device first, then quantize.

    Buffers (all in the state dict):
      int8:            qweight [out, in] int8, scales [out] (float32; bfloat16 for the "cpu" backend)
      int4, torch/triton: qweight [out, padded_in / 2] uint8 (`int4` layout),
                          scales and mins [out, groups] float32
      int4, cpu:       qweight [out, padded_in / 2] uint8 (the CPU op's layout),
                       scale_zero [groups, out, 2] bfloat16, w = (code - 8) * scale + zero
    """

    def __init__(self, in_features: int, out_features: int, method: str = "int8", group_size: int = 128,
                 bias: bool = False, backend: str = "torch", device: torch.device | str | None = None,
                 bias_dtype: torch.dtype = torch.float32):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if method == "int4" and (group_size < 2 or group_size % 2):
            raise ValueError(f"group_size must be an even number >= 2, got {group_size}")
        self.in_features, self.out_features = in_features, out_features
        self.method, self.backend = method, backend
        self.group_size = group_size if method == "int4" else None
        n, k = out_features, in_features
        kw = dict(device=device)
        if method == "int8":
            self.register_buffer("qweight", torch.zeros(n, k, dtype=torch.int8, **kw))
            scale_dtype = torch.bfloat16 if backend == "cpu" else torch.float32
            self.register_buffer("scales", torch.zeros(n, dtype=scale_dtype, **kw))
        else:
            padded = padded_in_features(k, group_size)
            groups = padded // group_size
            self.register_buffer("qweight", torch.zeros(n, padded // 2, dtype=torch.uint8, **kw))
            if backend == "cpu":
                self.register_buffer("scale_zero", torch.zeros(groups, n, 2, dtype=torch.bfloat16, **kw))
            else:
                self.register_buffer("scales", torch.zeros(n, groups, **kw))
                self.register_buffer("mins", torch.zeros(n, groups, **kw))
        self.register_buffer("bias", torch.zeros(n, dtype=bias_dtype, **kw) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, method: str = "int8", group_size: int = 128,
                    backend: str = "auto") -> "QuantLinear":
        """Quantize an `nn.Linear`'s weight into a new `QuantLinear` on the same device."""
        w = linear.weight.detach()  # [out, in]
        device = w.device
        backend, _ = choose_backend(backend, device, method, linear.in_features, linear.out_features, group_size)
        q = cls(linear.in_features, linear.out_features, method, group_size, linear.bias is not None, backend,
                device, linear.bias.dtype if linear.bias is not None else torch.float32)
        if linear.bias is not None:
            q.bias.copy_(linear.bias.detach())
        if method == "int8":
            codes, scales = quantize_int8(w)
            q.qweight.copy_(codes)
            q.scales.copy_(scales)
        elif backend == "cpu":
            packed, scales, mins = quantize_int4(w, group_size)
            codes = unpack_int4(packed).to(torch.int32)  # [out, padded]
            q.qweight.copy_(torch._convert_weight_to_int4pack_for_cpu(codes, 1))
            zero = mins + 8 * scales  # the op computes (code - 8) * scale + zero
            q.scale_zero.copy_(torch.stack([scales, zero], dim=-1).transpose(0, 1))  # [groups, out, 2]
        else:
            packed, scales, mins = quantize_int4(w, group_size)
            q.qweight.copy_(packed)
            q.scales.copy_(scales)
            q.mins.copy_(mins)
        return q

    def _apply(self, fn, recurse=True):
        """`.to()`, `.half()`, `.cuda()`: the codes and scales keep their dtypes (x's dtype sets what the layer
        computes in; the "cpu" op takes bfloat16 scales only), and only the bias is converted. A "cpu" or
        "triton" layer stays on its kind of device (the CPU op's layout, the Triton kernels): quantize again there."""
        here = self.qweight.device
        device = fn(torch.empty(0, device=here)).device
        if self.backend != "torch" and device.type not in (here.type, "meta"):
            raise RuntimeError(f"a QuantLinear with backend={self.backend!r} cannot move from {here} to {device}: "
                               f"its layout and kernels are for {here.type}. Quantize the model again on {device}.")
        stored = {id(self._buffers[name]) for name in ("qweight", "scales", "mins", "scale_zero")
                  if name in self._buffers}
        return super()._apply(lambda t: t.to(device) if id(t) in stored else fn(t), recurse)

    @property
    def padded_in_features(self) -> int:
        return self.in_features if self.method == "int8" else padded_in_features(self.in_features, self.group_size)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight this layer multiplies by, W [out, in], as floats."""
        if self.method == "int8":
            return dequantize_int8(self.qweight, self.scales.float(), dtype)
        if self.backend != "cpu":
            return dequantize_int4(self.qweight, self.scales, self.mins, self.in_features, dtype)
        sz = self.scale_zero.float()  # [groups, out, 2]
        groups = sz.shape[0]
        codes = self._cpu_int4_codes().view(self.out_features, groups, self.group_size)  # [out, groups, G]
        scale, zero = sz[..., 0].t()[..., None], sz[..., 1].t()[..., None]  # [out, groups, 1] each
        w = (codes - 8) * scale + zero  # [out, groups, G]
        return w.reshape(self.out_features, -1)[:, : self.in_features].to(dtype)

    def _cpu_int4_codes(self) -> torch.Tensor:
        """The 4-bit codes [out, padded_in] as floats, read back from the CPU op's opaque layout.

        Multiplying the identity by the packed weight with scale 1 and zero 8 gives
        (code - 8) * 1 + 8 = code in every entry: small integers, exact in bfloat16.
        """
        unit = torch.zeros_like(self.scale_zero)
        unit[..., 0], unit[..., 1] = 1.0, 8.0
        return self._cpu_int4_weight_t(unit).t().float()  # [out, padded]

    def _cpu_int4_weight_t(self, scale_zero: torch.Tensor | None = None) -> torch.Tensor:
        """W^T [padded_in, out] in bfloat16 exactly as the CPU op dequantizes it (with this layer's scales and
        zeros, or `scale_zero`): the op applied to the identity."""
        eye = torch.eye(self.padded_in_features, dtype=torch.bfloat16, device=self.qweight.device)
        sz = self.scale_zero if scale_zero is None else scale_zero
        return torch._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group_size, sz)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> y [..., out_features] in x's dtype."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x has {x.shape[-1]} features, this layer expects {self.in_features}")
        if self.backend == "cpu":
            y = self._forward_cpu(x)
        elif self.backend == "triton":
            y = self._forward_triton(x)
        else:
            y = self._forward_torch(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "int8":
            return F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)  # [..., out]
        return F.linear(x, self.dequantize(x.dtype))  # [..., out]

    def _forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # [tokens, in]
        many = self.dequantizes_for(x2.shape[0])  # many rows: a bfloat16 matmul instead of the op
        if self.method == "int8":
            y = self._forward_torch(x2) if many else torch._weight_int8pack_mm(x2, self.qweight, self.scales)
        else:
            pad = self.padded_in_features - self.in_features
            if pad:
                x2 = F.pad(x2, (0, pad))  # [tokens, padded_in]: zeros meet the padding codes
            y = x2 @ self._cpu_int4_weight_t() if many else \
                torch._weight_int4pack_mm_for_cpu(x2, self.qweight, self.group_size, self.scale_zero)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)  # [..., out]

    def dequantizes_for(self, rows: int) -> bool:
        """True when this "cpu" layer computes a step of `rows` rows as a bfloat16 matmul, not through the op.
        Never inside `torch.compile`: a branch on the rows there would make a graph for each side
        (`course_lib.accel` gives compiled INT8 layers an operator that makes the same choice as the step runs)."""
        if self.backend != "cpu" or torch.compiler.is_compiling() or not onednn_has_kernels(torch.bfloat16):
            return False
        if self.method == "int8":
            return rows >= INT8_DEQUANTIZE_ROWS
        return rows >= INT4_DEQUANTIZE_ROWS * self.padded_in_features

    def _forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        from . import triton_kernels

        if self.method == "int8":
            return triton_kernels.int8_linear(x, self.qweight, self.scales)
        return triton_kernels.int4_linear(x, self.qweight, self.scales, self.mins, self.in_features)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.method == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}"
                f"{group}, backend={self.backend}, bias={self.bias is not None}")


def quantize_model(model: nn.Module, method: str, group_size: int = 128, backend: str = "auto",
                   include_lm_head: bool = False) -> nn.Module:
    """Swap every `nn.Linear` of `model` for a `QuantLinear`, in place, and return the model.

    method: "int8" (per output channel) or "int4" (asymmetric, `group_size` inputs per group).
    include_lm_head: also quantize the output projection `lm_head`. Off by default: it is the
      most sensitive layer, and when it is tied to the embedding (SmolLM2) quantizing it adds
      a copy instead of saving memory. Embeddings (`nn.Embedding`) are never quantized.
    backend: "auto" (Triton on CUDA, PyTorch's packed kernels on the CPU where the layer's
      shape allows, else "torch", with a warning naming the layers), or "torch" / "cpu" / "triton".
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and (include_lm_head or name.split(".")[-1] != "lm_head")]
    fallbacks = []
    for name, linear in targets:
        chosen, why = choose_backend(backend, linear.weight.device, method, linear.in_features,
                                     linear.out_features, group_size)
        if why is not None:
            fallbacks.append(f"{name} ({why})")
        model.set_submodule(name, QuantLinear.from_linear(linear, method, group_size, chosen))
    if fallbacks:
        warnings.warn(f"quantize_model: {len(fallbacks)} layer(s) use the slower 'torch' backend: "
                      + "; ".join(fallbacks[:5]) + (" ..." if len(fallbacks) > 5 else ""), stacklevel=2)
    return model


def quantized_copy(model: nn.Module, method: str, group_size: int = 128, backend: str = "auto",
                   include_lm_head: bool = False) -> nn.Module:
    """A quantized copy of `model`, which is left as it was; the copy *shares* every tensor it
    does not quantize (embedding, norms), so it costs only its new codes and scales.

    Because of that sharing, never change the copy's dtype or device in place (`.to(...)` would
    convert the original's shared tensors too): convert the float model first, then quantize.
    """
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return quantize_model(copy.deepcopy(model, memo=shared), method, group_size, backend, include_lm_head)
