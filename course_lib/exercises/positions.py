"""Checkers for chapter 02's positions (位置编码): RoPE's wavelengths and RoPE itself.

Each one tests the learner's function on inputs the chapter does not use, against the engine:

    check_long_wavelength_pairs(long_wavelength_pairs)     # vs course_lib.model.rope_inv_freq
    check_rope(rope)                                       # vs course_lib.model.apply_rope, and its properties

The chapter's embedding exercises (table bytes, nearest neighbours) are checked in `embeddings.py`.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..config import ModelConfig
from ..model import apply_rope, rope_inv_freq
from ..tolerance import relative_difference
from .check import Case, as_int_list, run_checks, seeded_randn


# --- exercise 2: the pairs that never turn once within the context -----------------------------------------------


def _wavelengths(theta: float, head_dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    config = ModelConfig(vocab_size=1, hidden_size=head_dim, intermediate_size=1, num_layers=1, num_heads=1,
                         num_kv_heads=1, head_dim=head_dim, rope_theta=theta)
    return 2 * math.pi / rope_inv_freq(config).to(dtype)


def long_wavelength_reference(theta: float, head_dim: int, context_len: int) -> list[int]:
    """Pairs i (0 .. head_dim/2 - 1) whose wavelength 2*pi/theta_i is longer than `context_len` tokens."""
    return torch.nonzero(_wavelengths(theta, head_dim) > context_len).flatten().tolist()


def _pairs_case(name: str, theta: float, head_dim: int, context_len: int) -> Case:
    want = long_wavelength_reference(theta, head_dim, context_len)
    half = head_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    variants = {  # plausible mistakes -> what to fix
        "long wavelengths belong to the slow pairs (large i): wavelength = 2*pi / theta_i":
            [j for j in range(half) if j not in want],
        "a wavelength is 2*pi / theta_i tokens (one full turn is 2*pi radians)":
            torch.nonzero(theta ** (2 * i / head_dim) > context_len).flatten().tolist(),
        "theta_i = rope_theta ** (-2 i / head_dim) for i = 0 .. head_dim/2 - 1":
            torch.nonzero(2 * math.pi * theta ** (i / head_dim) > context_len).flatten().tolist(),
    }

    def verify(result: object) -> None:
        got = as_int_list(result, "the pair indices")
        if got == want:
            return
        if sorted(got) == want:
            raise AssertionError("right pairs, but return them in increasing order")
        hints = [h for h, v in variants.items() if v == got and v != want]
        raise AssertionError(f"got {len(got)} pairs {_short(got)}, expected {len(want)}: {_short(want)}"
                             + (f"; hint: {hints[0]}" if hints else ""))

    return Case(f"{name}: rope_theta {theta:,.0f}, head_dim {head_dim}, context {context_len:,}",
                (theta, head_dim, context_len), verify)


def _short(ids: list[int]) -> str:
    if len(ids) > 4 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    return str(ids)


PAIR_CASES = [  # (name, rope_theta, head_dim, context length)
    ("Llama-2-7B", 10000.0, 128, 4096),
    ("Llama-3-8B", 500000.0, 128, 8192),
    ("Qwen2.5-0.5B", 1000000.0, 64, 32768),
    ("GPT-NeoX-20B (rotary on 24 of 96 dims)", 10000.0, 24, 2048),
    ("a tiny head", 100.0, 16, 50),
]


def check_long_wavelength_pairs(fn: Callable[[float, int, int], list[int]]) -> bool:
    """`fn(rope_theta, head_dim, context_len)` -> the pairs i whose wavelength 2*pi/theta_i exceeds the context.

    Checked against `course_lib.model.rope_inv_freq` on the RoPE settings of five models (none of them SmolLM2).
    """
    return run_checks("check_long_wavelength_pairs", fn, [_pairs_case(*c) for c in PAIR_CASES])


# --- exercise 3: RoPE from scratch ----------------------------------------------------------------------------------

ROPE_TOL = 1e-3  # of the largest |value|: float32 angles pos * theta_i are off by ~pos * 6e-8 rad (1.5e-4 at 2,500)


def rope_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The engine's `apply_rope` on x [..., seq, head_dim], with cos/sin from float64 angles."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    angles = positions.to(torch.float64)[:, None] * inv_freq  # [seq, d/2]
    emb = torch.cat([angles, angles], dim=-1)  # [seq, d]
    cos, sin = emb.cos()[None], emb.sin()[None]  # [1, seq, d]: apply_rope's [batch, seq, head_dim]
    lead = x.shape[:-2]
    flat = x.to(torch.float64).reshape(-1, *x.shape[-2:])  # [n, seq, d]
    rotated = apply_rope(flat.transpose(0, 1)[None], cos, sin)  # [1, seq, n, d]: n plays the heads
    return rotated[0].transpose(0, 1).reshape(*lead, *x.shape[-2:])


def _interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """The RoFormer paper's pairing (2i, 2i + 1): a plausible mistake for the Llama layout (i, i + d/2)."""
    d = x.shape[-1]
    x = x.to(torch.float64)
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a = positions.to(torch.float64)[:, None] * inv_freq  # [seq, d/2]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * a.cos() - odd * a.sin()
    out[..., 1::2] = even * a.sin() + odd * a.cos()
    return out


def _rope_variants(x: torch.Tensor, positions: torch.Tensor, theta: float) -> dict[str, torch.Tensor]:
    d = x.shape[-1]
    return {
        "pair dimension i with i + d/2 (the Llama layout of this engine and transformers), not 2i with 2i + 1":
            _interleaved(x, positions, theta),
        "rotate each row by its own position, positions[j], not by j":
            rope_reference(x, torch.arange(x.shape[-2]), theta),
        "the rotation goes the other way: (a, b) -> (a cos - b sin, a sin + b cos)":
            rope_reference(x, -positions, theta),
        "theta_i = theta ** (-2 i / d), i = 0 .. d/2 - 1":
            rope_reference(x, positions, theta ** 0.5) if d else x,
    }


def _tensor(result: object, like: torch.Tensor, what: str) -> torch.Tensor:
    assert isinstance(result, torch.Tensor), f"return {what} as a torch.Tensor, got {type(result).__name__}"
    assert result.shape == like.shape, f"{what} must keep x's shape {list(like.shape)}, got {list(result.shape)}"
    assert result.is_floating_point(), f"{what} must be floating point, got {result.dtype}"
    return result.detach().to(torch.float64).cpu()


def _rope_equal_case(description: str, x: torch.Tensor, positions: torch.Tensor, theta: float) -> Case:
    want = rope_reference(x, positions, theta)
    variants = _rope_variants(x, positions, theta)

    def verify(result: object) -> None:
        got = _tensor(result, x, "the rotated x")
        err = relative_difference(got, want)
        if err <= ROPE_TOL:
            return
        hints = [h for h, v in variants.items() if relative_difference(got, v) <= ROPE_TOL]
        norm_err = (got.norm(dim=-1) - x.to(torch.float64).norm(dim=-1)).abs().max().item()
        extra = f"; a rotation keeps lengths, and yours change them by up to {norm_err:.2g}" if norm_err > 1e-3 else ""
        raise AssertionError(f"max |yours - apply_rope| / max |apply_rope| = {err:.3g} (tolerance {ROPE_TOL:g})"
                             + (f"; hint: {hints[0]}" if hints else extra))

    return Case(description, (x, positions, theta), verify)


def _rope_zero_case() -> Case:
    x = seeded_randn(3, 5, 32, seed=31)
    positions = torch.zeros(5, dtype=torch.long)

    def verify(result: object) -> None:
        err = relative_difference(_tensor(result, x, "the rotated x"), x)
        assert err <= ROPE_TOL, (f"at position 0 every angle is 0, so x must come back unchanged: max change "
                                 f"{err:.3g} of the largest |x|")

    return Case("position 0 changes nothing (x [3, 5, 32], theta 10,000)", (x, positions, 10000.0), verify)


def _rope_composes_case(fn: Callable) -> Case:
    """rope(rope(x, m), n) == rope(x, m + n): the learner's function against itself."""
    x = seeded_randn(6, 64, seed=32)
    m = torch.tensor([3, 50, 0, 700, 9, 1])
    n = torch.tensor([4, 1, 20, 300, 9, 2000])

    def twice(x, m, n, theta):
        return fn(fn(x, m, theta), n, theta), fn(x, m + n, theta)

    def verify(result: object) -> None:
        assert isinstance(result, tuple) and len(result) == 2
        a, b = (_tensor(r, x, "the rotated x") for r in result)
        err = relative_difference(a, b)
        assert err <= ROPE_TOL, (f"rotating by m, then by n, must equal rotating by m + n (angles add): "
                                 f"max difference {err:.3g} of the largest |value| (tolerance {ROPE_TOL:g})")

    return Case("rope(rope(x, m), n) == rope(x, m + n) (x [6, 64], theta 500,000)", (x, m, n, 500000.0),
                verify), twice


def check_rope(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> bool:
    """`fn(x, positions, theta)` -> x [..., seq, head_dim] with row j rotated RoPE-style for position positions[j].

    Checked within 1e-3 of the largest |value| against the engine's `apply_rope` (float64 angles) on head sizes,
    thetas and positions the chapter does not use, and for two properties: position 0 changes nothing; rotations by
    m then n compose to m + n.
    """
    composes, twice = _rope_composes_case(fn)
    cases = [
        _rope_equal_case("head_dim 64, theta 100,000, unsorted and repeated positions (x [6, 64])",
                         seeded_randn(6, 64, seed=33), torch.tensor([7, 0, 31, 2500, 12, 12]), 100000.0),
        _rope_equal_case("head_dim 128, theta 500,000, 4 heads (x [4, 5, 128]), positions 300..304",
                         seeded_randn(4, 5, 128, seed=34), torch.arange(300, 305), 500000.0),
        _rope_equal_case("head_dim 16, theta 10, fast turns (x [10, 16]), positions 0..9",
                         seeded_randn(10, 16, seed=35), torch.arange(10), 10.0),
        _rope_equal_case("float32 input, head_dim 64, theta 10,000 (x [2, 3, 64])",
                         seeded_randn(2, 3, 64, seed=36, dtype=torch.float32), torch.tensor([1, 1000, 2047]), 10000.0),
        _rope_zero_case(),
        composes,
    ]

    def run(*args):
        return twice(*args) if len(args) == 4 else fn(*args)

    return run_checks("check_rope", run, cases)
