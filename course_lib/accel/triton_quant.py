"""Triton kernels for weight-only INT8 and INT4 linear layers: dequantize inside the matmul.

Each program computes a [BLOCK_M, BLOCK_N] tile of y = x @ W^T over one slice of the input
dimension K. It walks its slice in steps of BLOCK_K, loads the *quantized* weight tile (1 byte
or half a byte a weight), turns it into floats in registers, and feeds it to `tl.dot`. The float
weight never exists in memory, which is the point: a decode step reads 4x (INT8) or ~7x (INT4)
fewer weight bytes than float32, and decode is bound by those bytes.

    INT8: acc += x_tile @ q_tile                 then y = acc * scale[n]   (one scale per row: factor it out)
    INT4: for each group g of the slice:  scale[n, g], min[n, g]   loaded once, a [BLOCK_N] vector each
              for each BLOCK_K step inside g:  w_tile = code * scale + min   (broadcast down the K axis)
                                               acc += x_tile @ w_tile

The grid is (row tiles, column tiles, K slices). Prefill (many rows) has enough row x column
tiles to fill a GPU, so it takes one slice (no split). Decode (1-16 rows) has a single row
tile, and a 576-wide layer cut into 64-column tiles gives 9 programs for a GPU with over a
hundred SMs; so decode takes narrower column tiles and splits K ("split-K"):

      W [N, K], one program per (column tile, K slice)      one [M, N] plane per slice
              slice 0     slice 1     slice 2
          +-----------+-----------+-----------+      +---------+ +---------+ +---------+
    N  t0 | prog 0,0  | prog 0,1  | prog 0,2  |      | partial | | partial | | partial |  [S, M, N] float32
    |  t1 | prog 1,0  | prog 1,1  | prog 1,2  |  ->  |  sums   | |  sums   | |  sums   |
    v  .. |    ...    |    ...    |    ...    |      +---------+ +---------+ +---------+
          +-----------+-----------+-----------+              \       |       /
                    K (in_features) ->                  y = sum over slices (torch), cast
       each program: x[:, slice] @ W[tile, slice]^T

Every program writes its float32 partial tile to its own plane of a [split, M, N] buffer, and
`torch.sum` over the planes adds them up afterwards: no atomics, so the result is the same on
every run (an atomic_add would add the slices in whatever order they finish). The buffer is
split * M * N floats: for one row a few percent of the weight's bytes, at 16 rows of a 576-wide
INT4 layer about as many. `plan_launch` picks the tiles and the split from the layer's shape
alone, so tests can check the grid without a GPU.

Below compute capability 8.0 (a T4 is 7.5) Triton compiles `tl.dot` to plain FMAs: no tensor cores, so a
decode step padded to BLOCK_M = 16 rows does 16x the multiply-adds of one row. `choose_kernel` sends such a card
elsewhere: a step of up to SPLIT_K_MAX_ROWS rows to `_rows_linear_kernel`, which multiplies a dequantized
[BLOCK_N, BLOCK_K] weight tile by each row and sums along K (`tl.sum`), with BLOCK_M the rows rounded up to a
power of two; more rows (a prompt) dequantize the weight and call cuBLAS (`F.linear`), which on a T4 runs
float16 on its tensor cores. From 8.0 every step takes the tiled kernels above.

The PyTorch twins are `int8.dequantize_int8` / `int4.dequantize_int4` followed by `F.linear`;
`tests/test_quant_triton.py` compares the two under TRITON_INTERPRET=1, which must be set
before this module is imported (triton decides at decoration time whether to interpret).
The interpreter of triton 3.9 gets `tl.dot` on bfloat16 blocks wrong, so bfloat16 is checked
on CUDA only; float32 and float16 are checked in both places.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..quant import int4, int8

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SPLIT_K_MAX_ROWS = 16  # up to this many rows a step is decode-like: one row tile, split K
TARGET_PROGRAMS = 128  # about one program per SM of a datacenter GPU (an H100 has 132)
TENSOR_CORE_DOT = (8, 0)  # from this compute capability Triton's tl.dot runs on tensor cores (mma)
ROWS_TILE = 8192  # elements of a row kernel's [BLOCK_M, BLOCK_N, BLOCK_K] product: 64 a thread at 4 warps


def choose_kernel(capability: tuple[int, int], rows: int) -> str:
    """Which path a step of `rows` rows takes on a card of compute capability `capability` (7.5 -> (7, 5)):
    "tile" (tl.dot on tensor cores), "rows" (multiply and sum, for few rows where tl.dot would be plain FMAs on
    a 16-row tile), or "dequantize" (many rows without tensor-core tl.dot: dequantize, then cuBLAS)."""
    if rows < 1:
        raise ValueError(f"need at least one row, got {rows}")
    if tuple(capability) >= TENSOR_CORE_DOT:
        return "tile"
    return "rows" if rows <= SPLIT_K_MAX_ROWS else "dequantize"


@dataclass(frozen=True)
class LaunchPlan:
    """Tile sizes and K split of one kernel launch; the grid is (row tiles, column tiles, split_k)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int  # K slices, each summed by its own programs
    k_per_split: int  # input columns per slice: a multiple of block_k, and of group_size for INT4
    grid: tuple[int, int, int]

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def _largest_pow2_divisor(n: int, cap: int) -> int:
    return min(n & -n, cap)  # n & -n: the lowest set bit of n


def plan_launch(rows: int, in_features: int, out_features: int, group_size: int = 0,
                kernel: str = "tile") -> LaunchPlan:
    """Tiles and K split for `rows` x `in_features` times a [out_features, in_features] weight.

    group_size 0 means INT8 (one scale per row); otherwise INT4 with that group size, whose
    BLOCK_K divides the group (so a K step never straddles two groups) and whose K slices hold
    whole groups. Up to SPLIT_K_MAX_ROWS rows, K is split until the grid has about
    TARGET_PROGRAMS programs (never an empty slice); beyond, one slice. kernel "rows" (`_rows_linear_kernel`,
    up to SPLIT_K_MAX_ROWS rows) takes BLOCK_M = rows rounded up to a power of two and a BLOCK_K that keeps its
    [BLOCK_M, BLOCK_N, BLOCK_K] product at ROWS_TILE elements (128 for 1-2 rows, 16 for 16)."""
    if min(rows, in_features, out_features) < 1 or group_size < 0:
        raise ValueError(f"need positive sizes, got rows={rows} in={in_features} out={out_features} group={group_size}")
    if kernel not in ("tile", "rows"):
        raise ValueError(f"kernel must be 'tile' or 'rows', got {kernel!r}")
    if kernel == "rows" and rows > SPLIT_K_MAX_ROWS:
        raise ValueError(f"the row kernel takes up to {SPLIT_K_MAX_ROWS} rows, got {rows}")
    decode = rows <= SPLIT_K_MAX_ROWS
    block_m = 16 if decode else 32  # 16: the smallest tile tl.dot takes
    block_n = 32 if decode else 64  # decode: narrower tiles, twice the programs
    block_k = 64 if decode else 32  # the same tile area, block_k x block_n, either way
    if kernel == "rows":
        block_m = triton.next_power_of_2(rows)  # no 16-row padding: at most 2x the rows
        block_k = min(128, ROWS_TILE // (block_m * block_n))
    if group_size:
        block_k = _largest_pow2_divisor(group_size, block_k)
    chunk = group_size or block_k  # the unit a K slice is made of
    chunks = math.ceil(in_features / chunk)
    tiles = math.ceil(rows / block_m) * math.ceil(out_features / block_n)
    wanted = min(chunks, math.ceil(TARGET_PROGRAMS / tiles)) if decode else 1
    per_split = math.ceil(chunks / wanted)  # chunks a slice
    split_k = math.ceil(chunks / per_split)  # drops slices that would be empty
    grid = (math.ceil(rows / block_m), math.ceil(out_features / block_n), split_k)
    return LaunchPlan(block_m, block_n, block_k, split_k, per_split * chunk, grid)


@triton.jit
def _dot(x, w, PRECISION: tl.constexpr):
    """x [BM, BK] @ w [BK, BN] in float32; tl.dot needs BK >= 16, smaller (INT4 groups of 2-8) multiply and sum."""
    if x.shape[1] >= 16:
        return tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
    return tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)  # [BM, BK, BN] -> [BM, BN]


@triton.jit
def _int8_linear_kernel(
    x_ptr, q_ptr, scale_ptr, y_ptr, M, N, K, K_PER_SPLIT,
    stride_xm, stride_qn, stride_ys, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    k_lo = tl.program_id(2) * K_PER_SPLIT  # this program's K slice: [k_lo, k_lo + K_PER_SPLIT)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BM, BK]
        q = tl.load(q_ptr + rn[None, :] * stride_qn + rk[:, None],
                    mask=(rn[None, :] < N) & (rk[:, None] < K), other=0)  # [BK, BN] int8
        acc += _dot(x, q, PRECISION)  # int8 codes are exact in fp16/bf16/fp32
    scale = tl.load(scale_ptr + rn, mask=rn < N, other=0.0)  # [BN]
    y = acc * scale[None, :]  # scaling each slice's partial sum is the same as scaling their total
    tl.store(y_ptr + tl.program_id(2) * stride_ys + rm[:, None] * stride_ym + rn[None, :],
             y.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _int4_linear_kernel(
    x_ptr, packed_ptr, scale_ptr, min_ptr, y_ptr, M, N, K, n_groups, GROUPS_PER_SPLIT,
    stride_xm, stride_pn, stride_ys, stride_ym,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    g_lo = tl.program_id(2) * GROUPS_PER_SPLIT  # this program's slice: whole groups
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g in range(g_lo, tl.minimum(g_lo + GROUPS_PER_SPLIT, n_groups)):
        scale = tl.load(scale_ptr + rn * n_groups + g, mask=rn < N, other=0.0)  # [BN], once per group
        low = tl.load(min_ptr + rn * n_groups + g, mask=rn < N, other=0.0)  # [BN]
        for kk in range(0, GROUP_SIZE, BLOCK_K):  # BLOCK_K divides GROUP_SIZE
            rk = g * GROUP_SIZE + kk + tl.arange(0, BLOCK_K)  # K is the real width: padded columns are never read
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BM, BK]
            byte = tl.load(packed_ptr + rn[None, :] * stride_pn + (rk // 2)[:, None],
                           mask=(rn[None, :] < N) & (rk[:, None] < K), other=0)  # [BK, BN]
            code = (byte >> ((rk % 2) * 4)[:, None]) & 0x0F  # even k: low nibble, odd k: high nibble
            w = code.to(tl.float32) * scale[None, :] + low[None, :]  # [BK, BN], dequantized in registers only
            acc += _dot(x, w, PRECISION)
    tl.store(y_ptr + tl.program_id(2) * stride_ys + rm[:, None] * stride_ym + rn[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _rows_linear_kernel(
    x_ptr, w_ptr, scale_ptr, min_ptr, y_ptr, M, N, K, n_groups, K_PER_SPLIT,
    stride_xm, stride_wn, stride_ys, stride_ym,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """INT8 (GROUP_SIZE 0: w is codes [N, K] int8) or INT4 (w is packed [N, K/2] uint8) for few rows, no tl.dot:
    each K step dequantizes a [BLOCK_N, BLOCK_K] weight tile once and multiplies every row by it."""
    rm = tl.arange(0, BLOCK_M)  # every row of x: one row tile
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    k_lo = tl.program_id(2) * K_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, tl.minimum(k_lo + K_PER_SPLIT, K), BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0).to(tl.float32)  # [BM, BK]
        w_mask = (rn[:, None] < N) & (rk[None, :] < K)
        if GROUP_SIZE == 0:
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=w_mask, other=0).to(tl.float32)  # [BN, BK]
        else:  # BLOCK_K divides GROUP_SIZE: the whole step lies in group k0 // GROUP_SIZE
            byte = tl.load(w_ptr + rn[:, None] * stride_wn + (rk // 2)[None, :], mask=w_mask, other=0)  # [BN, BK]
            code = (byte >> ((rk % 2) * 4)[None, :]) & 0x0F  # even k: low nibble, odd k: high nibble
            g = k0 // GROUP_SIZE
            scale = tl.load(scale_ptr + rn * n_groups + g, mask=rn < N, other=0.0)  # [BN]
            low = tl.load(min_ptr + rn * n_groups + g, mask=rn < N, other=0.0)  # [BN]
            w = code.to(tl.float32) * scale[:, None] + low[:, None]  # [BN, BK]
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)  # [BM, BN, BK] -> [BM, BN]
    if GROUP_SIZE == 0:
        acc = acc * tl.load(scale_ptr + rn, mask=rn < N, other=0.0)[None, :]  # one scale per output row
    tl.store(y_ptr + tl.program_id(2) * stride_ys + rm[:, None] * stride_ym + rn[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


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


@functools.cache
def _device_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)  # asked once per GPU, not at every layer of every step


def _capability(x: torch.Tensor) -> tuple[int, int]:
    """The compute capability of x's GPU; under the interpreter (CPU tensors) an H100's, (9, 0)."""
    return _device_capability(x.device.index if x.device.index is not None else torch.cuda.current_device()) \
        if x.is_cuda else (9, 0)


def _outputs(x: torch.Tensor, n: int, plan: LaunchPlan) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """x as [M, K], the buffer the kernel writes ([split, M, N]; float32 partial sums when split), its meta."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
    dtype = torch.float32 if plan.split_k > 1 else x.dtype
    out = torch.empty(plan.split_k, x2.shape[0], n, device=x.device, dtype=dtype)  # [S, M, N]
    meta = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
                PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # fp32: no TF32 rounding
                enable_fp_fusion=True)  # a*b+c as one FMA, stated: Triton 3.10 changes the default to off
    return x2, out, meta


def _rows_meta(meta: dict) -> dict:
    """The row kernel's launch arguments: the tiles and the FMA option, without tl.dot's precision."""
    return {k: v for k, v in meta.items() if k != "PRECISION"}


def _reduce(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[S, M, N] -> y [..., N] in x's dtype: add the K slices' partial sums (a fixed order: deterministic)."""
    y = out[0] if out.shape[0] == 1 else out.sum(0).to(x.dtype)  # [M, N]
    return y.view(*x.shape[:-1], out.shape[-1])  # [..., N]


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                capability: tuple[int, int] | None = None) -> torch.Tensor:
    """x [..., K] @ (codes [N, K] int8 * scales [N])^T -> y [..., N] in x's dtype. The kernel is chosen by
    `choose_kernel` from the rows and `capability` (x's GPU's when None; a test passes another)."""
    if codes.dtype != torch.int8 or codes.dim() != 2:
        raise TypeError(f"codes must be a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
    if scales.shape != (codes.shape[0],):
        raise ValueError(f"scales must have shape ({codes.shape[0]},), got {tuple(scales.shape)}")
    _check_input(x, codes.shape[1], codes, scales)
    n, k = codes.shape
    codes, scales = codes.contiguous(), scales.float().contiguous()
    rows = math.prod(x.shape[:-1]) or 1
    kernel = choose_kernel(capability or _capability(x), rows)
    if kernel == "dequantize":  # cuBLAS in x's dtype: float16 on a T4's tensor cores
        return F.linear(x, int8.dequantize_int8(codes, scales, x.dtype))
    plan = plan_launch(rows, k, n, kernel=kernel)
    x2, out, meta = _outputs(x, n, plan)
    if kernel == "rows":
        _rows_linear_kernel[plan.grid](x2, codes, scales, scales, out, x2.shape[0], n, k, 1, plan.k_per_split,
                                       x2.stride(0), codes.stride(0), out.stride(0), out.stride(1),
                                       GROUP_SIZE=0, **_rows_meta(meta))
        return _reduce(out, x)
    _int8_linear_kernel[plan.grid](x2, codes, scales, out, x2.shape[0], n, k, plan.k_per_split,
                                   x2.stride(0), codes.stride(0), out.stride(0), out.stride(1), **meta)
    return _reduce(out, x)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                in_features: int, capability: tuple[int, int] | None = None) -> torch.Tensor:
    """x [..., K] @ W^T with W stored as `int4.quantize_int4` returns it -> y [..., N] in x's dtype; the kernel
    is chosen as `int8_linear` chooses it."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TypeError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    n, padded = packed.shape[0], packed.shape[1] * 2
    if scales.shape != mins.shape or scales.dim() != 2 or scales.shape[0] != n or padded % scales.shape[1]:
        raise ValueError(f"scales {tuple(scales.shape)} / mins {tuple(mins.shape)} do not fit packed {tuple(packed.shape)}")
    if in_features > padded:
        raise ValueError(f"in_features {in_features} exceeds the {padded} packed columns")
    _check_input(x, in_features, packed, scales, mins)
    n_groups = scales.shape[1]
    group_size = padded // n_groups
    packed, scales, mins = packed.contiguous(), scales.float().contiguous(), mins.float().contiguous()
    rows = math.prod(x.shape[:-1]) or 1
    kernel = choose_kernel(capability or _capability(x), rows)
    if kernel == "dequantize":
        return F.linear(x, int4.dequantize_int4(packed, scales, mins, in_features, x.dtype))
    plan = plan_launch(rows, in_features, n, group_size, kernel=kernel)
    x2, out, meta = _outputs(x, n, plan)
    if kernel == "rows":
        _rows_linear_kernel[plan.grid](x2, packed, scales, mins, out, x2.shape[0], n, in_features, n_groups,
                                       plan.k_per_split, x2.stride(0), packed.stride(0), out.stride(0),
                                       out.stride(1), GROUP_SIZE=group_size, **_rows_meta(meta))
        return _reduce(out, x)
    _int4_linear_kernel[plan.grid](x2, packed, scales, mins, out, x2.shape[0], n, in_features, n_groups,
                                   plan.k_per_split // group_size,
                                   x2.stride(0), packed.stride(0), out.stride(0), out.stride(1),
                                   GROUP_SIZE=group_size, **meta)
    return _reduce(out, x)
