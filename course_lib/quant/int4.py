"""INT4 weight-only quantization: asymmetric, group-wise along the input dimension.

Each row of W [out, in] is cut into groups of `group_size` consecutive input columns; every
group gets its own float32 step (`scale`) and offset (`min`), so a few large weights only
coarsen the grid of their own group:

    scale[n, g] = (max - min) / 15         over W[n, g*G : (g+1)*G]      # [out, groups] float32
    q[n, k]     = clamp(round((W[n, k] - min[n, g]) / scale[n, g]), 0, 15)   # 4-bit code, g = k // G
    W[n, k]    ~= q[n, k] * scale[n, g] + min[n, g]

Round-to-nearest keeps every element within scale[n, g] / 2 (half a step) of W[n, k].

Packing, two codes per byte, neighbours along `in` share a byte (low nibble first):

    byte[n, j] = q[n, 2j] | (q[n, 2j + 1] << 4)          # packed [out, padded_in / 2] uint8

    row n:  | q1 q0 | q3 q2 | q5 q4 | ...     (high nibble | low nibble)

(GGUF's Q4_0/Q4_1 pack differently: a byte holds elements j and j + 16 of a 32-element block,
see `gguf_blocks`.)

Widths a group does not divide: SmolLM2's hidden size 576 is 4.5 groups of 128. The weight is
padded on the right to a multiple of `group_size` (576 -> 640) by repeating each row's last
value, which leaves the last group's min and max, and so its step, exactly as the real
values alone would give. The padded codes are stored (they keep every group the same size,
which kernels like) and ignored: `dequantize_int4` cuts them off, and a matmul pads x with zeros.

Memory per row: padded_in / 2 bytes + 8 bytes per group; group 128 on 576 inputs:
320 + 40 = 360 bytes instead of 2304, about 0.16x float32.
"""
from __future__ import annotations

import math

import torch

QMAX = 15


def padded_in_features(in_features: int, group_size: int) -> int:
    """in_features rounded up to a whole number of groups."""
    return math.ceil(in_features / group_size) * group_size


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """codes [rows, k] with values 0..15 (k even) -> bytes [rows, k / 2] uint8, low nibble = even column."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even number of columns, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)  # [rows, k/2]


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """bytes [rows, k / 2] uint8 -> codes [rows, k] uint8 (values 0..15)."""
    low, high = packed & 0x0F, packed >> 4  # [rows, k/2] each
    return torch.stack([low, high], dim=-1).flatten(-2)  # [rows, k]: low, high, low, high, ...


def quantize_int4(weight: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [out, in] float -> (packed [out, padded_in/2] uint8, scales [out, groups], mins [out, groups]) float32."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_int4 expects a 2-D weight [out, in], got shape {tuple(weight.shape)}")
    if group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even number >= 2, got {group_size}")
    out_features, in_features = weight.shape
    padded = padded_in_features(in_features, group_size)
    w = weight.detach().float()  # [out, in]
    if padded > in_features:
        w = torch.cat([w, w[:, -1:].expand(-1, padded - in_features)], dim=1)  # [out, padded]
    groups = w.view(out_features, padded // group_size, group_size)  # [out, groups, G]
    mins = groups.amin(dim=-1)  # [out, groups]
    scales = (groups.amax(dim=-1) - mins) / QMAX  # [out, groups]
    safe = scales.clamp(min=torch.finfo(torch.float32).tiny)  # a constant group gets codes 0, not NaN
    codes = torch.round((groups - mins[..., None]) / safe[..., None]).clamp(0, QMAX)  # [out, groups, G]
    return pack_int4(codes.view(out_features, padded)), scales, mins


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, in_features: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(packed [out, padded/2], scales [out, groups], mins [out, groups]) -> W [out, in_features] in `dtype`."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    out_features, padded = packed.shape[0], packed.shape[1] * 2
    if scales.shape != mins.shape or scales.dim() != 2 or scales.shape[0] != out_features or padded % scales.shape[1]:
        raise ValueError(f"scales {tuple(scales.shape)} and mins {tuple(mins.shape)} do not fit packed "
                         f"{tuple(packed.shape)}: expected [{out_features}, groups] with groups dividing {padded}")
    if in_features > padded:
        raise ValueError(f"in_features {in_features} is larger than the {padded} packed columns")
    n_groups = scales.shape[1]
    codes = unpack_int4(packed).float().view(out_features, n_groups, padded // n_groups)  # [out, groups, G]
    w = codes * scales.float()[..., None] + mins.float()[..., None]  # [out, groups, G]
    return w.view(out_features, padded)[:, :in_features].to(dtype)  # [out, in]
