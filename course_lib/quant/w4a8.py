"""W4A8: 4-bit weights times 8-bit activations in integer arithmetic, the way llama.cpp multiplies a Q4_1 file.

The INT4 layers of `linear.py` widen the 4-bit weights to bfloat16 and multiply in floating point. llama.cpp instead
quantizes each activation row too, in blocks of 32 (its Q8_1), and multiplies integers. This module is that
arithmetic in plain PyTorch: the reference that `course_lib/accel`'s C++ kernel (`csrc/linear.cpp`, `w4a8_linear`)
is tested against bit for bit (`tests/test_w4a8.py`).

Weights, one GGUF Q4_1 block per 32 inputs of a row (`gguf_blocks.quantize_q4_1`, ggml's own rounding):

    w[n, 32b + i] ~= dw[n, b] * c[n, 32b + i] + mw[n, b]          c in 0..15; dw, mw float16 (held as float32)

Activations, per row and block of 32 (Q8_1):

    dx[r, b] = max |x[r, 32b : 32b + 32]| / 127                    float32
    q[r, k]  = round_half_even(x[r, k] * (1 / dx[r, b]))            int8 in -127..127 (0 where dx = 0)
    sx[r, b] = dx[r, b] * sum of q[r, 32b : 32b + 32]               float32

The product of one row and one output, block by block:

    isum[r, n, b] = sum over i of c[n, 32b + i] * q[r, 32b + i]    an integer, |isum| <= 32 * 15 * 127 = 60960
    y[r, n] = sum over b of  (dw * dx) * isum  +  mw * sx           because sum (dw c + mw)(dx q) = the same

The float part is fixed so that any implementation can give the same bits: for b = 0, 1, ... in order,
`acc = (acc + float(isum) * (dw * dx)) + mw * sx`, every operation a float32 multiply or add rounded on its own (no
fused multiply-add). The integer part is exact in any order. The extra error against the bfloat16-activation
INT4 layer: each activation moves by up to half a step, dx / 2, about 0.4% of its block's largest value.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .gguf_blocks import BLOCK_SIZE, quantize_q4_1

QMAX_ACTIVATION = 127


def q4_1_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [out, in] float -> (codes [out, padded_in] uint8 in 0..15, dw [out, blocks], mw [out, blocks] float32, each
    a float16 value): GGUF Q4_1 blocks, byte for byte as ggml makes them. `in` is padded to a multiple of 32 by
    repeating each row's last value (as `int4.quantize_int4` pads); x's padding is zeros, which add nothing."""
    out_features, in_features = weight.shape
    w = weight.detach().float()  # [out, in]
    pad = -in_features % BLOCK_SIZE
    if pad:
        w = torch.cat([w, w[:, -1:].expand(-1, pad)], dim=1)  # [out, padded_in]
    blocks = quantize_q4_1(w).view(out_features, -1, 20)  # [out, blocks, 20] bytes: d, m (float16), 16 code bytes
    dw = blocks[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)  # [out, blocks]
    mw = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)  # [out, blocks]
    qs = blocks[..., 4:]  # [out, blocks, 16]: element i in the low nibble, i + 16 in the high one
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [out, blocks, 32]
    return codes.reshape(out_features, -1), dw, mw


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, in] float -> (q [rows, padded_in] int8, dx [rows, blocks], sx [rows, blocks] float32), as above."""
    x = x.float()
    x = F.pad(x, (0, -x.shape[-1] % BLOCK_SIZE)).view(x.shape[0], -1, BLOCK_SIZE)  # [rows, blocks, 32]
    dx = x.abs().amax(dim=-1) / QMAX_ACTIVATION  # [rows, blocks]
    inverse = torch.where(dx == 0, torch.zeros_like(dx), 1 / dx)  # [rows, blocks]
    q = torch.round(x * inverse[..., None]).clamp(-QMAX_ACTIVATION, QMAX_ACTIVATION)  # [rows, blocks, 32]
    sx = dx * q.sum(dim=-1)  # [rows, blocks]: the sum is an exact integer in float32
    return q.to(torch.int8).flatten(1), dx, sx


def block_dots(q: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """q [rows, padded_in] int8, codes [out, padded_in] uint8 -> isum [rows, out, blocks], exact integers held in
    float32. (The matmul runs in float64, where every partial sum, an integer below 2^53, is exact.)"""
    rows, out_features = q.shape[0], codes.shape[0]
    qb = q.double().view(rows, -1, BLOCK_SIZE).transpose(0, 1)  # [blocks, rows, 32]
    cb = codes.double().view(out_features, -1, BLOCK_SIZE).permute(1, 2, 0)  # [blocks, 32, out]
    return torch.bmm(qb, cb).permute(1, 2, 0).float()  # [rows, out, blocks]


def w4a8_linear(x: torch.Tensor, codes: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ W^T with W as Q4_1 blocks (`q4_1_weight`) and x quantized per block (`quantize_activations`):
    y [..., out] float32, with the float operations in the order the module docstring fixes."""
    x2 = x.reshape(-1, x.shape[-1])  # [rows, in]
    q, dx, sx = quantize_activations(x2)
    isum = block_dots(q, codes)  # [rows, out, blocks]
    scale = dw[None] * dx[:, None, :]  # [rows, out, blocks]: dw * dx
    weighted = isum * scale  # [rows, out, blocks]
    offset = mw[None] * sx[:, None, :]  # [rows, out, blocks]: the minimum times the block's sum
    acc = torch.zeros(x2.shape[0], codes.shape[0], device=x.device)  # [rows, out]
    for b in range(isum.shape[-1]):  # block by block, as the kernel sums
        acc = (acc + weighted[..., b]) + offset[..., b]
    return acc.view(*x.shape[:-1], codes.shape[0])


class W4A8Linear(torch.nn.Module):
    """A linear layer computed by `w4a8_linear` (the reference, slow): the weight as Q4_1 blocks, x quantized to
    8 bits per block of 32 on every call. Returns x's dtype. `quantize_model_w4a8` swaps it in."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        codes, dw, mw = q4_1_weight(linear.weight)
        self.register_buffer("codes", codes)
        self.register_buffer("dw", dw)
        self.register_buffer("mw", mw)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = w4a8_linear(x, self.codes, self.dw, self.mw)  # [..., out] float32
        return (y if self.bias is None else y + self.bias).to(x.dtype)


def quantize_model_w4a8(model: torch.nn.Module, include_lm_head: bool = False) -> torch.nn.Module:
    """Swap every `nn.Linear` of `model` (not `lm_head` unless asked) for a `W4A8Linear`, in place; returns it."""
    for name, linear in [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                         and (include_lm_head or n.split(".")[-1] != "lm_head")]:
        model.set_submodule(name, W4A8Linear(linear))
    return model
