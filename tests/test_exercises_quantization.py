"""The chapter 08 checkers accept a reference solution and refuse a plausible wrong answer and an untouched stub."""
from __future__ import annotations

import math
import struct

import torch

from course_lib.exercises import check_decode_q4_1_block, check_int8_per_channel, check_quantized_linear_bytes


def stub(*args):
    raise NotImplementedError


# ---- INT8 per channel

def int8_reference(w):
    scales = w.abs().amax(dim=1) / 127  # [out]
    safe = scales.clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8), scales


def int8_per_tensor(w):  # one scale for the whole matrix: the classic slip
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale.expand(w.shape[0]).clone()


def int8_truncating(w):  # floor instead of round
    scales = w.abs().amax(dim=1) / 127
    return torch.trunc(w / scales.clamp(min=1e-30)[:, None]).to(torch.int8), scales


def test_int8_checker(capsys):
    w = torch.randn(48, 80)
    assert check_int8_per_channel(int8_reference, weight=w)
    assert not check_int8_per_channel(int8_per_tensor)
    assert not check_int8_per_channel(int8_truncating)
    assert not check_int8_per_channel(stub)
    out = capsys.readouterr().out
    assert "per channel" in out and "not attempted" in out


# ---- a Q4_1 block from bytes

def q4_1_reference(block):
    d, m = struct.unpack("<ee", block[:4])
    qs = torch.tensor(list(block[4:]), dtype=torch.int32)
    codes = torch.cat([qs & 0x0F, qs >> 4]).float()  # [32]
    return torch.tensor(d, dtype=torch.float32) * codes + torch.tensor(m, dtype=torch.float32)


def q4_1_interleaved(block):  # nibbles of a byte as neighbours: the engine's INT4 layout, not GGUF's
    d, m = struct.unpack("<ee", block[:4])
    codes = [c for b in block[4:] for c in (b & 0x0F, b >> 4)]
    return torch.tensor([d * c + m for c in codes], dtype=torch.float32)


def test_q4_1_checker(capsys):
    assert check_decode_q4_1_block(q4_1_reference)
    assert not check_decode_q4_1_block(q4_1_interleaved)
    assert "w[i + 16]" in capsys.readouterr().out  # the hint names the GGUF layout
    assert not check_decode_q4_1_block(stub)


# ---- bytes of the linear layers

def linear_bytes_reference(config, method, group_size, scale_bytes):
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    total = 0
    for out_f, in_f in [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]:
        if method == "float32":
            total += 4 * out_f * in_f
        elif method == "int8":
            total += out_f * in_f + out_f * scale_bytes
        else:
            groups = math.ceil(in_f / group_size)
            total += out_f * groups * group_size // 2 + out_f * groups * 2 * scale_bytes
    return total * config.num_layers


def linear_bytes_unpadded(config, method, group_size, scale_bytes):
    if method != "int4":
        return linear_bytes_reference(config, method, group_size, scale_bytes)
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]
    return config.num_layers * sum(o * k // 2 + o * (k // group_size) * 2 * scale_bytes for o, k in shapes)


def test_bytes_checker(capsys):
    assert check_quantized_linear_bytes(linear_bytes_reference)
    assert not check_quantized_linear_bytes(linear_bytes_unpadded)
    assert "pad" in capsys.readouterr().out
    assert not check_quantized_linear_bytes(stub)
