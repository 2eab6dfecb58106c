"""Linear layers whose weight is laid out once for the CPU's kernels, and `pack_linears`, which swaps them in.

`F.linear` lets the BLAS library re-lay-out the weight inside every call; for the few rows of a decode step that
costs as much as the product. A `PackedLinear` holds the weight as oneDNN packed it once (any rows), and where
the plan says so also as panels (`csrc/linear.cpp`) for steps of 1 to `panel_rows` rows, where those read the
weight faster. It gives the same product as `F.linear` up to rounding (`tests/test_packed_linear.py`).
"""
from __future__ import annotations

import functools
import weakref

import torch
import torch.nn as nn

from ..model import Transformer


@functools.cache
def onednn_has_kernels(dtype: torch.dtype) -> bool:
    """True where this CPU's oneDNN has bfloat16 (or float16) matmul kernels, AVX-512 and newer: where
    half-precision weights pay on the CPU (the plan, `OneDNNQuantLinear`'s many-row steps)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return dtype == torch.float16 and torch.ops.mkldnn._is_mkldnn_fp16_supported()


class PackedLinear(nn.Module):
    """An `nn.Linear` whose weight oneDNN has re-laid-out once for the CPU's vector and matrix units.

    The packed weight is an opaque oneDNN tensor: it cannot be saved, moved or read back, so pack last (after
    fusing and quantizing), for serving only. `ops` (the built extension) enables two more things:
    `panel_rows` > 0 keeps the weight as panels too (twice the memory) and sends calls of 1 to `panel_rows` rows
    through them; `for_graph=True` keeps the packed weight in the extension's table under a number (`handle`),
    because a compiled graph cannot take an opaque tensor as an input: it calls `course_lib::onednn_linear`.
    """

    def __init__(self, linear: nn.Linear, ops=None, panel_rows: int = 0, for_graph: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(w, None), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        width = ops.panel_width[str(w.dtype).removeprefix("torch.")] if ops is not None and panel_rows else 0
        fits = width and self.out_features % width == 0 and self.in_features % 2 == 0
        self.register_buffer("panels", ops.pack_panels(w) if fits else None, persistent=False)
        self.ops, self.panel_rows = ops, panel_rows if fits else 0
        self.handle = None  # the packed weight's number in the extension's table, for a compiled graph
        if for_graph:
            if ops is None:
                raise RuntimeError("PackedLinear(for_graph=True) needs the built extension (ops)")
            self.handle = ops.keep(self.packed_weight)  # the same tensor: no copy
            weakref.finalize(self, ops.release, self.handle)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if torch.compiler.is_compiling():  # the operator chooses between oneDNN and the panels as the step runs
            if self.handle is None:
                raise RuntimeError("a compiled graph calls a PackedLinear by handle: build it with for_graph=True")
            y = torch.ops.course_lib.onednn_linear(x.reshape(rows, self.in_features), self.handle, self.out_features,
                                                   self.panels, self.panel_rows)
        elif 1 <= rows <= self.panel_rows:
            y = self.ops.by_panels(x.reshape(rows, self.in_features), self.panels)
        else:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        """`.to()`, `.half()`, `.cuda()`: refused where they would change the dtype or device (the layout is this
        CPU's, in this dtype); a conversion that changes neither has nothing to do."""
        dtype = self.packed_weight.dtype
        probe = fn(torch.empty(0, dtype=dtype))
        if probe.dtype != dtype or probe.device.type != "cpu":
            raise RuntimeError(f"PackedLinear holds its weight laid out for this CPU in {dtype}: it cannot become "
                               f"{probe.dtype} on {probe.device}. Load the model again as wanted, and pack last.")
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"panel_rows={self.panel_rows}")


def pack_linears(model: Transformer, ops=None, panel_rows: int = 0, for_graph: bool = False) -> Transformer:
    """Turn every plain `nn.Linear` of `model` (the lm_head included; a tied one gets its own packed copy of the
    embedding matrix) into a `PackedLinear`, in place; returns the model. Quantized layers are left as they are."""
    for name, module in [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]:
        model.set_submodule(name, PackedLinear(module, ops, panel_rows, for_graph))
    return model
