"""Checkers of chapter 02: each passes a solution, fails plausible mistakes, reports a stub as not attempted."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.exercises import (check_long_wavelength_pairs, check_nearest_neighbours, check_rope,
                                  check_table_bytes)
from course_lib.exercises.positions import PAIR_CASES, _wavelengths
from course_lib.quant.gguf_blocks import quantize_q4_0, quantize_q4_1, quantize_q8_0

# --- exercise 1 ---------------------------------------------------------------------------------------------------

BYTES_PER_BLOCK = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}  # 32 weights a block: codes + float16 scale (+ minimum)


def table_bytes(rows, cols, fmt):
    if fmt in ("F32", "F16"):
        return rows * cols * (4 if fmt == "F32" else 2)
    if cols % 32:
        raise ValueError(f"a row of {cols} weights is not a whole number of 32-weight blocks")
    return rows * (cols // 32) * BYTES_PER_BLOCK[fmt]


def table_bytes_codes_only(rows, cols, fmt):
    bits = {"F32": 32, "F16": 16, "Q8_0": 8, "Q4_0": 4, "Q4_1": 4}[fmt]
    if cols % 32:
        raise ValueError("not whole blocks")
    return rows * cols * bits // 8


def table_bytes_no_check(rows, cols, fmt):
    if fmt in ("F32", "F16"):
        return rows * cols * (4 if fmt == "F32" else 2)
    return math.ceil(rows * cols / 32) * BYTES_PER_BLOCK[fmt]


def table_bytes_q4_1_as_q4_0(rows, cols, fmt):
    return table_bytes(rows, cols, "Q4_0" if fmt == "Q4_1" else fmt)


@pytest.mark.parametrize("fmt,quantize", [("Q8_0", quantize_q8_0), ("Q4_0", quantize_q4_0), ("Q4_1", quantize_q4_1)])
def test_table_bytes_solution_matches_the_engine_quantizers(fmt, quantize):
    """The reference arithmetic equals the bytes the engine's own GGUF quantizers produce."""
    assert table_bytes(5, 96, fmt) == quantize(torch.randn(5, 96)).numel()


@pytest.mark.parametrize("wrong,hint", [(table_bytes_codes_only, "scale"), (table_bytes_no_check, "ValueError"),
                                        (table_bytes_q4_1_as_q4_0, "minimum")])
def test_check_table_bytes(wrong, hint, capsys):
    assert check_table_bytes(table_bytes) is True
    assert check_table_bytes(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and hint in out


# --- exercise 2 ---------------------------------------------------------------------------------------------------


def long_pairs(theta, head_dim, context_len):
    return [i for i in range(head_dim // 2) if 2 * math.pi * theta ** (2 * i / head_dim) > context_len]


def long_pairs_fast_ones(theta, head_dim, context_len):
    return [i for i in range(head_dim // 2) if 2 * math.pi * theta ** (2 * i / head_dim) <= context_len]


def long_pairs_no_two_pi(theta, head_dim, context_len):
    return [i for i in range(head_dim // 2) if theta ** (2 * i / head_dim) > context_len]


def long_pairs_count(theta, head_dim, context_len):
    return len(long_pairs(theta, head_dim, context_len))


def test_pair_cases_are_unambiguous():
    """No wavelength sits so close to its context length that float32 and float64 disagree."""
    for _, theta, head_dim, context in PAIR_CASES:
        w32, w64 = _wavelengths(theta, head_dim), _wavelengths(theta, head_dim, torch.float64)
        assert torch.equal(w32 > context, w64 > context)
        assert ((w64 - context).abs() / context).min() > 1e-3
        assert long_pairs(theta, head_dim, context) == torch.nonzero(w32 > context).flatten().tolist()


@pytest.mark.parametrize("wrong,hint", [(long_pairs_fast_ones, "slow pairs"), (long_pairs_no_two_pi, "2*pi"),
                                        (long_pairs_count, "list")])
def test_check_long_wavelength_pairs(wrong, hint, capsys):
    assert check_long_wavelength_pairs(long_pairs) is True
    assert check_long_wavelength_pairs(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and hint in out


# --- exercise 3 ---------------------------------------------------------------------------------------------------


def rope(x, positions, theta, sign=1.0, layout="half"):
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    angles = sign * positions.to(torch.float64)[:, None] * inv_freq  # [seq, d/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if layout == "half":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def rope_float32_angles(x, positions, theta):
    """Angles in float32, as the engine computes them: must pass within the stated tolerance."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    angles = positions.float()[:, None] * inv_freq
    a, b = x[..., : d // 2], x[..., d // 2:]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rope_complex(x, positions, theta):
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    z = z * torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions[:, None] * inv_freq)
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("solution", [rope, rope_float32_angles, rope_complex])
def test_check_rope_passes_solutions(solution):
    assert check_rope(solution) is True


@pytest.mark.parametrize("wrong,hint", [
    (lambda x, p, t: rope(x, p, t, layout="pairs"), "i + d/2"),
    (lambda x, p, t: rope(x, p, t, sign=-1.0), "other way"),
    (lambda x, p, t: rope(x, torch.arange(x.shape[-2]), t), "positions[j]"),
    (lambda x, p, t: x * 1.0, "max |yours"),
])
def test_check_rope_fails_mistakes(wrong, hint, capsys):
    assert check_rope(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and hint in out


# --- exercise 4 ---------------------------------------------------------------------------------------------------


def nearest(table, query, k, exclude):
    sims = F.normalize(table.float(), dim=-1) @ F.normalize(query.float(), dim=0)
    sims[list(exclude)] = -2.0
    return sims.topk(k).indices.tolist()


def nearest_by_dot(table, query, k, exclude):
    sims = table.float() @ query.float()
    sims[list(exclude)] = -math.inf
    return sims.topk(k).indices.tolist()


def nearest_keeps_query(table, query, k, exclude):
    sims = F.normalize(table.float(), dim=-1) @ F.normalize(query.float(), dim=0)
    return sims.topk(k).indices.tolist()


def nearest_worst_first(table, query, k, exclude):
    return nearest(table, query, k, exclude)[::-1]


class _Tokenizer:
    """A stand-in tokenizer: one id per word, rows of a random table."""
    words = {" London": 10, " seven": 11, " happy": 12, " Paris": 13, " France": 14, " Italy": 15}

    def encode(self, word):
        return [self.words[word]]


def test_check_nearest_neighbours_passes_solution_with_a_table():
    table = torch.randn(300, 32, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 5, 300)[:, None]
    assert check_nearest_neighbours(nearest, table, _Tokenizer()) is True
    assert check_nearest_neighbours(nearest, table.bfloat16(), _Tokenizer()) is True


@pytest.mark.parametrize("wrong,hint", [(nearest_by_dot, "dot product"), (nearest_keeps_query, "exclude"),
                                        (nearest_worst_first, "best first")])
def test_check_nearest_neighbours_fails_mistakes(wrong, hint, capsys):
    assert check_nearest_neighbours(wrong) is False
    out = capsys.readouterr().out
    assert "✗" in out and hint in out


# --- all ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", [check_table_bytes, check_long_wavelength_pairs, check_rope,
                                   check_nearest_neighbours])
def test_stub_is_not_attempted(check, capsys):
    def stub(*args):
        raise NotImplementedError

    assert check(stub) is False
    assert "not attempted" in capsys.readouterr().out
