"""INT8 weight-only quantization: symmetric, one scale per output channel.

For a weight W [out_features, in_features] (the layout of `nn.Linear.weight`):

    scale[n]  = max_k |W[n, k]| / 127                            # [out] float32, one per row
    q[n, k]   = clamp(round(W[n, k] / scale[n]), -127, 127)      # [out, in] int8
    W[n, k]  ~= q[n, k] * scale[n]

Row n, stored:   q[n, 0] q[n, 1] ... q[n, in-1]   (1 byte each)  +  scale[n] (4 bytes)

Symmetric: 0.0 maps to code 0 exactly and -128 is never used, so the grid is the same on
both sides of zero. Round-to-nearest keeps every element within scale[n] / 2 of W[n, k].
Memory: in + 4 bytes per row instead of 4 * in, about 0.25x float32.
"""
from __future__ import annotations

import torch

QMAX = 127


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] float -> (codes [out, in] int8, scales [out] float32)."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_int8 expects a 2-D weight [out, in], got shape {tuple(weight.shape)}")
    w = weight.detach().float()  # [out, in]
    scales = w.abs().amax(dim=1) / QMAX  # [out]
    safe = scales.clamp(min=torch.finfo(torch.float32).tiny)  # an all-zero row gets codes 0, not NaN
    codes = torch.round(w / safe[:, None]).clamp(-QMAX, QMAX).to(torch.int8)  # [out, in]
    return codes, scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(codes [out, in] int8, scales [out]) -> W [out, in] in `dtype`, computed in float32."""
    if codes.dtype != torch.int8 or codes.dim() != 2:
        raise ValueError(f"codes must be a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
    if scales.shape != (codes.shape[0],):
        raise ValueError(f"scales must have shape ({codes.shape[0]},), got {tuple(scales.shape)}")
    return (codes.float() * scales.float()[:, None]).to(dtype)  # [out, in]
