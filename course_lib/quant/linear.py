"""`QuantLinear`, a drop-in for `nn.Linear` with INT8 or INT4 weights, and `quantize_model`.

The model file never learns that quantization exists: `quantize_model` walks the model and
swaps each `nn.Linear` for a `QuantLinear` holding the same weight as codes plus scales.

The forward is the lesson's, the same on every device: dequantize, then `F.linear` in x's dtype.
INT8 keeps its per-row scale out of the matmul: y = F.linear(x, codes) * scale. Kernels that
dequantize inside the matmul (oneDNN's packed ops on the CPU, Triton on CUDA) are machine-specific:
`LLM(accel=True)` swaps them in (`course_lib.accel.quant_linear`).
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .int4 import dequantize_int4, padded_in_features, quantize_int4
from .int8 import dequantize_int8, quantize_int8

METHODS = ("int8", "int4")


class QuantLinear(nn.Module):
    """y = x @ W^T + b with W stored as INT8 (per output channel) or INT4 (group-wise) codes.

    Buffers (all in the state dict):
      int8:  qweight [out, in] int8, scales [out] float32
      int4:  qweight [out, padded_in / 2] uint8 (`int4` layout), scales and mins [out, groups] float32
    """

    backend = "torch"  # the kernel that multiplies; accel's subclasses name theirs

    def __init__(self, in_features: int, out_features: int, method: str = "int8", group_size: int = 128,
                 bias: bool = False, device: torch.device | str | None = None,
                 bias_dtype: torch.dtype = torch.float32):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "int4" and (group_size < 2 or group_size % 2):
            raise ValueError(f"group_size must be an even number >= 2, got {group_size}")
        self.in_features, self.out_features = in_features, out_features
        self.method = method
        self.group_size = group_size if method == "int4" else None
        n, k = out_features, in_features
        if method == "int8":
            self.register_buffer("qweight", torch.zeros(n, k, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.zeros(n, device=device))
        else:
            padded = padded_in_features(k, group_size)
            self.register_buffer("qweight", torch.zeros(n, padded // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scales", torch.zeros(n, padded // group_size, device=device))
            self.register_buffer("mins", torch.zeros(n, padded // group_size, device=device))
        self.register_buffer("bias", torch.zeros(n, dtype=bias_dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, method: str = "int8", group_size: int = 128) -> "QuantLinear":
        """Quantize an `nn.Linear`'s weight into a new `QuantLinear` on the same device."""
        w = linear.weight.detach()  # [out, in]
        q = cls(linear.in_features, linear.out_features, method, group_size, linear.bias is not None, w.device,
                linear.bias.dtype if linear.bias is not None else torch.float32)
        if linear.bias is not None:
            q.bias.copy_(linear.bias.detach())
        if method == "int8":
            codes, scales = quantize_int8(w)
            q.qweight.copy_(codes)
            q.scales.copy_(scales)
        else:
            packed, scales, mins = quantize_int4(w, group_size)
            q.qweight.copy_(packed)
            q.scales.copy_(scales)
            q.mins.copy_(mins)
        return q

    def _apply(self, fn, recurse=True):
        """`.to()`, `.half()`, `.cuda()`: the codes and scales keep their dtypes (x's dtype sets what the layer
        computes in), and only the bias is converted."""
        device = fn(torch.empty(0, device=self.qweight.device)).device
        stored = {id(self._buffers[name]) for name in ("qweight", "scales", "mins") if name in self._buffers}
        return super()._apply(lambda t: t.to(device) if id(t) in stored else fn(t), recurse)

    @property
    def padded_in_features(self) -> int:
        return self.in_features if self.method == "int8" else padded_in_features(self.in_features, self.group_size)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight this layer multiplies by, W [out, in], as floats."""
        if self.method == "int8":
            return dequantize_int8(self.qweight, self.scales.float(), dtype)
        return dequantize_int4(self.qweight, self.scales, self.mins, self.in_features, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> y [..., out_features] in x's dtype."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x has {x.shape[-1]} features, this layer expects {self.in_features}")
        y = self.matmul(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> x @ W^T [..., out], without the bias: what a faster kernel replaces."""
        if self.method == "int8":
            return F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)  # [..., out]
        return F.linear(x, self.dequantize(x.dtype))  # [..., out]

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.method == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}"
                f"{group}, backend={self.backend}, bias={self.bias is not None}")


def quantize_model(model: nn.Module, method: str, group_size: int = 128, include_lm_head: bool = False) -> nn.Module:
    """Swap every `nn.Linear` of `model` for a `QuantLinear`, in place, and return the model.

    method: "int8" (per output channel) or "int4" (asymmetric, `group_size` inputs per group).
    include_lm_head: also quantize the output projection `lm_head`. Off by default: it is the
      most sensitive layer, and when it is tied to the embedding (SmolLM2) quantizing it adds
      a copy instead of saving memory. Embeddings (`nn.Embedding`) are never quantized.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, linear in [(name, m) for name, m in model.named_modules()
                         if isinstance(m, nn.Linear) and (include_lm_head or name.split(".")[-1] != "lm_head")]:
        model.set_submodule(name, QuantLinear.from_linear(linear, method, group_size))
    return model


def quantized_copy(model: nn.Module, method: str, group_size: int = 128, include_lm_head: bool = False) -> nn.Module:
    """A quantized copy of `model`, which is left as it was; the copy *shares* every tensor it
    does not quantize (embedding, norms), so it costs only its new codes and scales.

    Because of that sharing, never change the copy's dtype or device in place (`.to(...)` would
    convert the original's shared tensors too): convert the float model first, then quantize.
    """
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return quantize_model(copy.deepcopy(model, memo=shared), method, group_size, include_lm_head)
