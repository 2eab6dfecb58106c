"""INT4 layers through the W4A8 kernel (`csrc/linear.cpp`): Q4_1 weights times int8 activations, integer dot products.

`LLM(accel=True, quantization="int4")` with groups of 32 (the default) swaps every linear layer that would become an
INT4 `QuantLinear` for a `W4A8PackedLinear`: the weight as GGUF Q4_1 blocks, repacked once into panels of 16
outputs, and the `QuantLinear` it would have been, kept for steps of more rows than `max_rows` (long prefills),
where PyTorch's INT4 op or a bfloat16 matmul is faster (`plan.w4a8_rows` measures where, once per machine). The
arithmetic, and its PyTorch twin that the kernel matches bit for bit: `course_lib/quant/w4a8.py`.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..quant.linear import QuantLinear
from ..quant.w4a8 import q4_1_weight

PANEL = 16  # outputs a panel


def pack_w4a8(codes: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor) -> torch.Tensor:
    """(codes [n, 32 B] uint8, dw and mw [n, B] float32 holding float16 values) -> [ceil(n/16), B, 320] uint8, the
    kernel's layout (csrc/linear.cpp): per panel and block, 256 code bytes (byte 4o + t of chunk j holds codes
    8j + t and 8j + 4 + t of output o), 16 float16 dw, 16 float16 mw. Outputs past n are zeros."""
    n, kp = codes.shape
    blocks = kp // 32
    pad = -n % PANEL
    codes = torch.cat([codes, codes.new_zeros(pad, kp)]) if pad else codes  # [n_pad, Kp]
    dw, mw = (torch.cat([s, s.new_zeros(pad, blocks)]) if pad else s for s in (dw, mw))  # [n_pad, B]
    panels = codes.shape[0] // PANEL
    c = codes.view(panels, PANEL, blocks, 4, 2, 4)  # [panel, o, b, j, nibble, t]: k = 32b + 8j + 4 nibble + t
    c = c.permute(0, 2, 3, 1, 5, 4)  # [panel, b, j, o, t, nibble]
    code_bytes = (c[..., 0] | (c[..., 1] << 4)).reshape(panels, blocks, 256)  # [panel, b, 256]
    scales = [s.to(torch.float16).view(panels, PANEL, blocks).transpose(1, 2).contiguous().view(torch.uint8)
              for s in (dw, mw)]  # [panel, b, 32] each
    return torch.cat([code_bytes, *scales], dim=-1).contiguous()  # [panel, b, 320]


class W4A8PackedLinear(nn.Module):
    """An INT4 (groups of 32) linear layer: 1 to `max_rows` rows through the W4A8 kernel, more through `fallback`,
    the `QuantLinear` the plan would have used. Returns x's dtype."""

    def __init__(self, linear: nn.Linear, ops, max_rows: int, isa: str = ""):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.ops, self.max_rows, self.isa = ops, max_rows, isa
        self.register_buffer("packed", pack_w4a8(*q4_1_weight(linear.weight)), persistent=False)
        self.fallback = QuantLinear.from_linear(linear, "int4", group_size=32)
        self.bias = self.fallback.bias  # the same tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if not 1 <= rows <= self.max_rows or x.dtype not in (torch.float32, torch.bfloat16):
            return self.fallback(x)
        x2 = x.reshape(rows, self.in_features)
        if torch.compiler.is_compiling():
            y = torch.ops.course_lib.w4a8_linear(x2, self.packed, self.out_features, self.isa)
        else:
            y = self.ops.w4a8_linear(x2, self.packed, self.out_features, self.isa)  # [rows, out] in x's dtype
        y = y if self.bias is None else y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"w4a8 for 1-{self.max_rows} rows")


def use_w4a8(model: nn.Module, ops, max_rows: int, include_lm_head: bool = False) -> nn.Module:
    """Swap every `nn.Linear` that INT4 quantization would take (not `lm_head` unless asked) for a
    `W4A8PackedLinear`, in place, before `quantize_model` runs (it reads the float weights); returns the model."""
    for name, linear in [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)
                         and (include_lm_head or n.split(".")[-1] != "lm_head")]:
        model.set_submodule(name, W4A8PackedLinear(linear, ops, max_rows))
    return model
