"""Triton kernels for weight-only INT8 and INT4 linear layers: dequantize inside the matmul.

Each program computes a [BLOCK_M, BLOCK_N] tile of y = x @ W^T. It walks the input dimension
in steps of BLOCK_K, loads the *quantized* weight tile (1 byte or half a byte a weight),
turns it into floats in registers, and feeds it to `tl.dot`. The float weight never exists
in memory, which is the point: a decode step reads 4x (INT8) or ~7x (INT4) fewer weight
bytes than float32, and decode is bound by those bytes.

    INT8: acc += x_tile @ q_tile            then y = acc * scale[n]   (one scale per row: factor it out)
    INT4: w_tile = code * scale[n, g] + min[n, g]   (g = k // group_size, codes unpacked from nibbles)
          acc += x_tile @ w_tile

The PyTorch twins are `int8.dequantize_int8` / `int4.dequantize_int4` followed by `F.linear`;
`tests/test_quant_triton.py` compares the two under TRITON_INTERPRET=1, which must be set
before this module is imported (triton decides at decoration time whether to interpret).
The interpreter of triton 3.9 gets `tl.dot` on bfloat16 blocks wrong, so bfloat16 is checked
on CUDA only; float32 and float16 are checked in both places.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _int8_linear_kernel(
    x_ptr, q_ptr, scale_ptr, y_ptr, M, N, K,
    stride_xm, stride_qn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BM, BK]
        q = tl.load(q_ptr + rn[None, :] * stride_qn + rk[:, None],
                    mask=(rn[None, :] < N) & (rk[:, None] < K), other=0)  # [BK, BN] int8
        acc += tl.dot(x, q.to(x.dtype), input_precision=PRECISION)  # int8 codes are exact in fp16/bf16/fp32
    scale = tl.load(scale_ptr + rn, mask=rn < N, other=0.0)  # [BN]
    y = acc * scale[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _int4_linear_kernel(
    x_ptr, packed_ptr, scale_ptr, min_ptr, y_ptr, M, N, K, n_groups,
    stride_xm, stride_pn, stride_ym,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # K is the real width: padded columns are never read
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BM, BK]
        w_mask = (rn[None, :] < N) & (rk[:, None] < K)
        byte = tl.load(packed_ptr + rn[None, :] * stride_pn + (rk // 2)[:, None], mask=w_mask, other=0)  # [BK, BN]
        code = (byte >> ((rk % 2) * 4)[:, None]) & 0x0F  # even k: low nibble, odd k: high nibble
        g = rk // GROUP_SIZE
        scale = tl.load(scale_ptr + rn[None, :] * n_groups + g[:, None], mask=w_mask, other=0.0)  # [BK, BN]
        low = tl.load(min_ptr + rn[None, :] * n_groups + g[:, None], mask=w_mask, other=0.0)  # [BK, BN]
        w = code.to(tl.float32) * scale + low  # [BK, BN], the dequantized tile, in registers only
        acc += tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def interpreting() -> bool:
    """True when Triton runs kernels with its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_input(x: torch.Tensor, in_features: int, *weights: torch.Tensor) -> None:
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[-1] != in_features:
        raise ValueError(f"x has {x.shape[-1]} input features, the layer expects {in_features}")
    if not x.is_cuda and not interpreting():
        raise RuntimeError(f"the Triton kernels need CUDA tensors (x is on {x.device}); on the CPU use the "
                           "PyTorch path, or set TRITON_INTERPRET=1 before importing this module to test them")
    for t in weights:
        if t.device != x.device:
            raise ValueError(f"x is on {x.device} but a weight tensor is on {t.device}")


def _launch_shape(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
    y = torch.empty(x2.shape[0], n, device=x.device, dtype=x.dtype)  # [M, N]
    block_m = 16 if x2.shape[0] <= 16 else 32  # decode is M = 1: do not waste a 64-row tile
    meta = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32,
                PRECISION="ieee" if x.dtype == torch.float32 else "tf32")  # fp32: no TF32 rounding
    return x2, y, meta


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ (codes [N, K] int8 * scales [N])^T -> y [..., N] in x's dtype."""
    if codes.dtype != torch.int8 or codes.dim() != 2:
        raise TypeError(f"codes must be a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
    if scales.shape != (codes.shape[0],):
        raise ValueError(f"scales must have shape ({codes.shape[0]},), got {tuple(scales.shape)}")
    _check_input(x, codes.shape[1], codes, scales)
    n, k = codes.shape
    codes, scales = codes.contiguous(), scales.float().contiguous()
    x2, y, meta = _launch_shape(x, n)
    grid = (triton.cdiv(x2.shape[0], meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
    _int8_linear_kernel[grid](x2, codes, scales, y, x2.shape[0], n, k,
                              x2.stride(0), codes.stride(0), y.stride(0), **meta)
    return y.view(*x.shape[:-1], n)  # [..., N]


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                in_features: int) -> torch.Tensor:
    """x [..., K] @ W^T with W stored as `int4.quantize_int4` returns it -> y [..., N] in x's dtype."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TypeError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    n, padded = packed.shape[0], packed.shape[1] * 2
    if scales.shape != mins.shape or scales.dim() != 2 or scales.shape[0] != n or padded % scales.shape[1]:
        raise ValueError(f"scales {tuple(scales.shape)} / mins {tuple(mins.shape)} do not fit packed {tuple(packed.shape)}")
    if in_features > padded:
        raise ValueError(f"in_features {in_features} exceeds the {padded} packed columns")
    _check_input(x, in_features, packed, scales, mins)
    n_groups = scales.shape[1]
    packed, scales, mins = packed.contiguous(), scales.float().contiguous(), mins.float().contiguous()
    x2, y, meta = _launch_shape(x, n)
    grid = (triton.cdiv(x2.shape[0], meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
    _int4_linear_kernel[grid](x2, packed, scales, mins, y, x2.shape[0], n, in_features, n_groups,
                              x2.stride(0), packed.stride(0), y.stride(0),
                              GROUP_SIZE=padded // n_groups, **meta)
    return y.view(*x.shape[:-1], n)  # [..., N]
