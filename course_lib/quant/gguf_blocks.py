"""GGUF (llama.cpp) block formats Q8_0, Q4_0 and Q4_1, decoded from raw bytes.

Every row of a GGUF tensor is a run of blocks of 32 consecutive weights; each block stores its
own float16 scale (and, for Q4_1, float16 minimum) in front of its codes. Little-endian bytes:

    Q8_0, 34 bytes per 32 weights (8.5 bits a weight):
        | d: f16 (2) | q[0] ... q[31]: int8 (32) |             w[i] = d * q[i]

    Q4_0, 18 bytes per 32 weights (4.5 bits a weight), symmetric:
        | d: f16 (2) | qs[0] ... qs[15]: uint8 (16) |
        w[i]      = d * ((qs[i] & 0x0F) - 8)      i = 0..15   (low nibbles: first half of the block)
        w[i + 16] = d * ((qs[i] >> 4)   - 8)                   (high nibbles: second half)

    Q4_1, 20 bytes per 32 weights (5 bits a weight), asymmetric:
        | d: f16 (2) | m: f16 (2) | qs[0] ... qs[15]: uint8 (16) |
        w[i] = d * (qs[i] & 0x0F) + m,  w[i + 16] = d * (qs[i] >> 4) + m

The decoders compute in float32 in the same order as llama.cpp (and the `gguf` package), so
their output is bit-exact. The quantizers follow ggml's reference `quantize_row_*` rounding,
so they reproduce `gguf.quants.quantize` byte for byte.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

BLOCK_SIZE = 32  # weights per block, all three formats
TYPE_SIZE = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # bytes per block


def _as_blocks(data: bytes | np.ndarray | torch.Tensor, fmt: str) -> torch.Tensor:
    """Raw bytes in any shape -> [n_blocks, bytes_per_block] uint8."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = np.frombuffer(data, dtype=np.uint8)
    if isinstance(data, np.ndarray):
        data = np.array(data, copy=not data.flags.writeable, order="C")  # a read-only memmap is copied
    t = torch.as_tensor(data)
    if t.dtype != torch.uint8:
        raise ValueError(f"{fmt} data must be raw bytes (uint8), got {t.dtype}")
    if t.numel() % TYPE_SIZE[fmt]:
        raise ValueError(f"{t.numel()} bytes is not a whole number of {TYPE_SIZE[fmt]}-byte {fmt} blocks")
    return t.reshape(-1, TYPE_SIZE[fmt])  # [n_blocks, type_size]


def _f16(two_bytes: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 (little-endian float16) -> [n, 1] float32."""
    return two_bytes.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] uint8 -> [n, 32] codes 0..15: low nibbles are elements 0..15, high nibbles 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _reshape(w: torch.Tensor, shape: Sequence[int] | None) -> torch.Tensor:
    return w.reshape(-1) if shape is None else w.reshape(tuple(shape))


def dequantize_q8_0(data: bytes | np.ndarray | torch.Tensor, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Q8_0 bytes -> float32 weights, reshaped to `shape` (rows..., cols) when given."""
    b = _as_blocks(data, "Q8_0")
    d = _f16(b[:, :2])  # [n, 1]
    q = b[:, 2:].contiguous().view(torch.int8).float()  # [n, 32]
    return _reshape(q * d, shape)


def dequantize_q4_0(data: bytes | np.ndarray | torch.Tensor, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Q4_0 bytes -> float32 weights, reshaped to `shape` (rows..., cols) when given."""
    b = _as_blocks(data, "Q4_0")
    d = _f16(b[:, :2])  # [n, 1]
    q = _nibbles(b[:, 2:]).to(torch.int8) - 8  # [n, 32] in -8..7
    return _reshape(d * q.float(), shape)


def dequantize_q4_1(data: bytes | np.ndarray | torch.Tensor, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Q4_1 bytes -> float32 weights, reshaped to `shape` (rows..., cols) when given."""
    b = _as_blocks(data, "Q4_1")
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])  # [n, 1] each
    q = _nibbles(b[:, 4:]).float()  # [n, 32] in 0..15
    return _reshape(d * q + m, shape)


DEQUANTIZERS = {"Q8_0": dequantize_q8_0, "Q4_0": dequantize_q4_0, "Q4_1": dequantize_q4_1}


def dequantize(data: bytes | np.ndarray | torch.Tensor, fmt: str, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Decode `data` stored in block format `fmt` ("Q8_0", "Q4_0" or "Q4_1")."""
    if fmt not in DEQUANTIZERS:
        raise ValueError(f"unsupported GGUF block format {fmt!r}; this module decodes {sorted(DEQUANTIZERS)}")
    return DEQUANTIZERS[fmt](data, shape)


def _to_blocks(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    x = torch.as_tensor(x, dtype=torch.float32)
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of the block size {BLOCK_SIZE}")
    return x.reshape(-1, BLOCK_SIZE)  # [n_blocks, 32]


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    """[n, 1] float32 -> [n, 2] uint8 (float16, little-endian)."""
    return v.to(torch.float16).view(torch.uint8)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _pack_halves(q: torch.Tensor) -> torch.Tensor:
    """[n, 32] codes 0..15 -> [n, 16] bytes: element i in the low nibble, element i + 16 in the high one."""
    q = q.to(torch.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def quantize_q8_0(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """float weights [..., k] (k a multiple of 32) -> Q8_0 bytes [n_blocks, 34]."""
    b = _to_blocks(x)
    d = b.abs().amax(dim=1, keepdim=True) / 127  # [n, 1]
    v = b * _inverse(d)
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)  # round half away from zero, as C's roundf
    return torch.cat([_f16_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=1)


def quantize_q4_0(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """float weights [..., k] -> Q4_0 bytes [n_blocks, 18]: the value of largest magnitude maps to -8."""
    b = _to_blocks(x)
    peak = b.gather(1, b.abs().argmax(dim=1, keepdim=True))  # [n, 1], signed
    d = peak / -8
    q = torch.trunc(b * _inverse(d) + 8.5).clamp(0, 15)  # [n, 32]
    return torch.cat([_f16_bytes(d), _pack_halves(q)], dim=1)


def quantize_q4_1(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """float weights [..., k] -> Q4_1 bytes [n_blocks, 20]: 16 steps from the block's min to its max."""
    b = _to_blocks(x)
    lo = b.amin(dim=1, keepdim=True)  # [n, 1]
    d = (b.amax(dim=1, keepdim=True) - lo) / 15
    q = torch.trunc((b - lo) * _inverse(d) + 0.5).clamp(0, 15)  # [n, 32]
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_halves(q)], dim=1)
