"""Checkers for chapter 02, embeddings and positions (词嵌入与位置编码): table bytes, wavelengths, RoPE, neighbours.

Each one tests the learner's function on inputs the chapter does not use, against the engine or the GGUF file:

    check_table_bytes(gguf_table_bytes)                    # vs the tensors of the course's GGUF file and gguf's sizes
    check_long_wavelength_pairs(long_wavelength_pairs)     # vs course_lib.model.rope_inv_freq
    check_rope(rope)                                       # vs course_lib.model.apply_rope, and its properties
    check_nearest_neighbours(nearest, table, tokenizer)    # vs float cosines, on random tables and the model's
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..model import apply_rope, rope_inv_freq
from .check import Case, run_checks


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Random tensor from its own generator: the learner's global seed is left alone."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _int(result: object, what: str) -> int:
    if isinstance(result, torch.Tensor) and result.numel() == 1 and not result.is_floating_point():
        result = int(result.item())
    assert isinstance(result, int) and not isinstance(result, bool), \
        f"return {what} as an int, got {type(result).__name__} {result!r}"
    return result


def _int_list(result: object, what: str) -> list[int]:
    if isinstance(result, torch.Tensor):
        assert not result.is_floating_point(), f"return {what} as integers, got a {result.dtype} tensor"
        return [int(v) for v in result.flatten().tolist()]
    assert isinstance(result, (list, tuple)), f"return {what} as a list of ints, got {type(result).__name__}"
    for v in result:
        assert isinstance(v, int) or (isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point()), \
            f"return {what} as a list of ints, got an element {v!r}"
    return [int(v) for v in result]


# --- exercise 1: bytes of a table in a GGUF format ------------------------------------------------------------------

BLOCK_FORMATS = ("Q8_0", "Q4_0", "Q4_1")


@functools.lru_cache(maxsize=1)
def _file_tensors() -> dict[str, tuple[str, int, int, int]]:
    """name -> (format, rows, cols, bytes) of some tensors of the course's GGUF file (read from its header only)."""
    from ..gguf_file import open_gguf
    from ..loading import default_gguf_path

    wanted = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight",
              "blk.0.attn_norm.weight"}
    out = {}
    for t in open_gguf(default_gguf_path()).tensors:
        if t.name in wanted:
            cols = int(t.shape[0])  # GGUF lists the fastest-varying dimension first: the length of a row
            rows = int(math.prod(int(s) for s in t.shape[1:]))
            out[t.name] = (t.tensor_type.name, rows, cols, int(t.n_bytes))
    return out


def _gguf_size(rows: int, cols: int, fmt: str) -> int:
    """Bytes from the `gguf` package's (weights per block, bytes per block) table: llama.cpp's own numbers."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    per_block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    assert cols % per_block == 0
    return rows * cols // per_block * type_size


def _bytes_case(description: str, rows: int, cols: int, fmt: str, want: int | None) -> Case:
    """`want` None: a row of `cols` weights does not fill whole blocks, so the function must raise ValueError."""
    n = rows * cols
    hints = {
        n // 2: "that counts the 4-bit codes only: each block of 32 also stores a float16 scale (2 bytes)"
                + (" and a float16 minimum (2 more)" if fmt == "Q4_1" else ""),
        n: "that counts the 8-bit codes only: each block of 32 also stores a float16 scale (2 bytes)",
        n // 32 * 18: "that is Q4_0 (a scale, no minimum: 18 bytes a block); Q4_1 also stores a float16 minimum",
        n // 32 * 20: "that is Q4_1 (a scale and a minimum: 20 bytes a block); Q4_0 stores a scale only",
        n // 32 * 34: "that is Q8_0 (34 bytes a block)",
        n * 4: "that is float32's 4 bytes a weight",
        n * 2: "that is 2 bytes a weight (float16)",
    }

    def verify(result: object) -> None:
        if want is None:
            assert result is _RAISED, (f"a row of {cols} weights does not fill whole blocks of 32: GGUF cannot "
                                       f"store it, so raise ValueError (got {result!r})")
            return
        got = _int(result, "the number of bytes")
        if got == want:
            return
        hint = hints.get(got, "")
        raise AssertionError(f"got {got:,} bytes, expected {want:,} ({want / n:.4g} bytes a weight)"
                             + (f"; hint: {hint}" if hint else ""))

    return Case(description, (rows, cols, fmt), verify)


_RAISED = object()  # what the runner hands to `verify` when the function raised ValueError


def check_table_bytes(fn: Callable[[int, int, str], int]) -> bool:
    """`fn(rows, cols, fmt)` -> bytes of a [rows, cols] table stored in `fmt` ("F32", "F16", "Q8_0", "Q4_0", "Q4_1").

    Checked against the sizes of real tensors in the course's GGUF file and against llama.cpp's block sizes
    (the `gguf` package) for other shapes. A row that does not fill whole blocks of 32 must raise ValueError.
    """
    file = _file_tensors()
    cases = []
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.attn_norm.weight"):
        fmt, rows, cols, n_bytes = file[name]
        cases.append(_bytes_case(f"{name} of the course's GGUF file: [{rows:,}, {cols:,}] in {fmt}", rows, cols,
                                 fmt, n_bytes))
    for rows, cols, fmt, label in [(128256, 4096, "Q4_1", "Llama-3-8B's embedding table"),
                                   (151936, 896, "Q8_0", "Qwen2.5-0.5B's embedding table"),
                                   (1000, 96, "Q4_0", "a small table"),
                                   (3, 64, "F16", "a float16 table")]:
        want = rows * cols * 2 if fmt == "F16" else _gguf_size(rows, cols, fmt)
        cases.append(_bytes_case(f"{label}: [{rows:,}, {cols:,}] in {fmt}", rows, cols, fmt, want))
    cases.append(_bytes_case("[10, 100] in Q4_1: rows of 100 weights are not whole blocks of 32", 10, 100, "Q4_1",
                             None))

    def run(rows: int, cols: int, fmt: str):
        try:
            return fn(rows, cols, fmt)
        except ValueError:
            if cols % 32:
                return _RAISED
            raise

    return run_checks("check_table_bytes", run, cases)


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
        got = _int_list(result, "the pair indices")
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

ROPE_TOL = 1e-3  # float32 angles pos * theta_i are off by ~pos * 6e-8 rad: 1.5e-4 at position 2,500


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
        err = (got - want).abs().max().item()
        if err <= ROPE_TOL:
            return
        hints = [h for h, v in variants.items() if (got - v).abs().max().item() <= ROPE_TOL]
        norm_err = (got.norm(dim=-1) - x.to(torch.float64).norm(dim=-1)).abs().max().item()
        extra = f"; a rotation keeps lengths, and yours change them by up to {norm_err:.2g}" if norm_err > 1e-3 else ""
        raise AssertionError(f"max |yours - apply_rope| = {err:.3g} (tolerance {ROPE_TOL:g})"
                             + (f"; hint: {hints[0]}" if hints else extra))

    return Case(description, (x, positions, theta), verify)


def _rope_zero_case() -> Case:
    x = _randn(3, 5, 32, seed=31)
    positions = torch.zeros(5, dtype=torch.long)

    def verify(result: object) -> None:
        err = (_tensor(result, x, "the rotated x") - x).abs().max().item()
        assert err <= ROPE_TOL, f"at position 0 every angle is 0, so x must come back unchanged: max change {err:.3g}"

    return Case("position 0 changes nothing (x [3, 5, 32], theta 10,000)", (x, positions, 10000.0), verify)


def _rope_composes_case(fn: Callable) -> Case:
    """rope(rope(x, m), n) == rope(x, m + n): the learner's function against itself."""
    x = _randn(6, 64, seed=32)
    m = torch.tensor([3, 50, 0, 700, 9, 1])
    n = torch.tensor([4, 1, 20, 300, 9, 2000])

    def twice(x, m, n, theta):
        return fn(fn(x, m, theta), n, theta), fn(x, m + n, theta)

    def verify(result: object) -> None:
        assert isinstance(result, tuple) and len(result) == 2
        a, b = (_tensor(r, x, "the rotated x") for r in result)
        err = (a - b).abs().max().item()
        assert err <= ROPE_TOL, (f"rotating by m, then by n, must equal rotating by m + n (angles add): "
                                 f"max difference {err:.3g} (tolerance {ROPE_TOL:g})")

    return Case("rope(rope(x, m), n) == rope(x, m + n) (x [6, 64], theta 500,000)", (x, m, n, 500000.0),
                verify), twice


def check_rope(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> bool:
    """`fn(x, positions, theta)` -> x [..., seq, head_dim] with row j rotated RoPE-style for position positions[j].

    Checked within 1e-3 against the engine's `apply_rope` (float64 angles) on head sizes, thetas and positions
    the chapter does not use, and for two properties: position 0 changes nothing; rotations by m then n compose
    to m + n.
    """
    composes, twice = _rope_composes_case(fn)
    cases = [
        _rope_equal_case("head_dim 64, theta 100,000, unsorted and repeated positions (x [6, 64])",
                         _randn(6, 64, seed=33), torch.tensor([7, 0, 31, 2500, 12, 12]), 100000.0),
        _rope_equal_case("head_dim 128, theta 500,000, 4 heads (x [4, 5, 128]), positions 300..304",
                         _randn(4, 5, 128, seed=34), torch.arange(300, 305), 500000.0),
        _rope_equal_case("head_dim 16, theta 10, fast turns (x [10, 16]), positions 0..9",
                         _randn(10, 16, seed=35), torch.arange(10), 10.0),
        _rope_equal_case("float32 input, head_dim 64, theta 10,000 (x [2, 3, 64])",
                         _randn(2, 3, 64, seed=36, dtype=torch.float32), torch.tensor([1, 1000, 2047]), 10000.0),
        _rope_zero_case(),
        composes,
    ]

    def run(*args):
        return twice(*args) if len(args) == 4 else fn(*args)

    return run_checks("check_rope", run, cases)


# --- exercise 4: nearest neighbours by cosine ------------------------------------------------------------------------


def _top(scores: torch.Tensor, k: int, exclude: Sequence[int]) -> list[int]:
    scores = scores.clone()
    if len(exclude):
        scores[list(exclude)] = -math.inf
    return scores.topk(k).indices.tolist()


def _prepare(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The table in float64 on the CPU (float32 on a GPU), and the length of each row: cast once per checker call."""
    tab = table.to(torch.float64 if table.device.type == "cpu" else torch.float32)
    return tab, tab.norm(dim=-1)


def _nearest_case(description: str, table: torch.Tensor, query: torch.Tensor, k: int, exclude: Sequence[int],
                  tol: float, prepared: tuple[torch.Tensor, torch.Tensor] | None = None) -> Case:
    tab, lengths = prepared or _prepare(table)
    q = query.to(tab.device, tab.dtype)
    dots = tab @ q  # [rows]
    sims = (dots / (lengths * q.norm()).clamp_min(1e-30)).cpu()  # cosines
    dots = dots.cpu()
    distances = lengths.cpu() ** 2 - 2 * dots + q.norm().cpu() ** 2  # squared Euclidean distances
    want = _top(sims, k, exclude)
    want_cos = sims[want]
    excluded = set(int(e) for e in exclude)
    wrong = {  # plausible mistakes -> what to fix
        "that ranks by the dot product; divide by both lengths to get the cosine": _top(dots, k, exclude),
        "that ranks by Euclidean distance; rank by cosine (angle) instead": _top(-distances, k, exclude),
    }

    def verify(result: object) -> None:
        got = _int_list(result, "the neighbours' ids")
        assert len(got) == k, f"return k = {k} ids, got {len(got)}"
        assert len(set(got)) == k, f"the ids must be distinct, got {got}"
        bad = [i for i in got if not 0 <= i < len(sims)]
        assert not bad, f"ids must be row numbers 0..{len(sims) - 1}, got {bad}"
        skipped = [i for i in got if i in excluded]
        assert not skipped, f"ids {skipped} are in `exclude` (e.g. the query token itself): leave them out"
        err = (sims[got] - want_cos).abs().max().item()
        if err <= tol:
            return
        hints = [h for h, ids in wrong.items() if ids == got and ids != want]
        if not hints and set(got) == set(want):
            hints = ["right ids, but return them best first (highest cosine first)"]
        raise AssertionError(f"cosines of your ids {[round(v, 3) for v in sims[got].tolist()]}, expected "
                             f"{[round(v, 3) for v in want_cos.tolist()]} (ids {want}; tolerance {tol:g})"
                             + (f"; hint: {hints[0]}" if hints else ""))

    return Case(description, (table, query, k, list(exclude)), verify)


def _tolerance(dtype: torch.dtype) -> float:
    """How far a learner's cosines may be from the reference: rounding in the table's own dtype."""
    return {torch.float64: 1e-9, torch.float32: 1e-5}.get(dtype, 2e-2)


def _random_table(rows: int, dim: int, seed: int) -> torch.Tensor:
    """Random rows whose lengths spread over two orders of magnitude (so dot product and cosine disagree)."""
    g = torch.Generator().manual_seed(seed)
    scale = 10 ** (torch.rand(rows, 1, generator=g, dtype=torch.float64) * 2 - 1)  # 0.1 .. 10
    return torch.randn(rows, dim, generator=g, dtype=torch.float64) * scale


def check_nearest_neighbours(fn: Callable[[torch.Tensor, torch.Tensor, int, Sequence[int]], list[int]],
                             table: torch.Tensor | None = None, tokenizer=None) -> bool:
    """`fn(table, query, k, exclude)` -> the k row ids most cosine-similar to `query`, best first, none in `exclude`.

    Checked on random tables (rows of very different lengths, float64, float32 and bfloat16) and, when `table`
    and `tokenizer` are given, on the model's embedding table for tokens and an analogy the chapter does not
    show. Ties within the table dtype's rounding may come in either order.
    """
    t = _random_table(400, 24, seed=41)
    t32, tb = t.float(), _random_table(2000, 64, seed=43).bfloat16()
    cases = [
        _nearest_case("random table [400, 24], query = row 17, exclude it, k 5", t, t[17], 5, [17], 1e-9),
        _nearest_case("the same table, a query that is not a row, nothing excluded, k 3", t,
                      _randn(24, seed=42), 3, [], 1e-9),
        _nearest_case("the same table in float32, query = row 3 - row 5 + row 8, exclude all three, k 4",
                      t32, t32[3] - t32[5] + t32[8], 4, [3, 5, 8], _tolerance(torch.float32)),
        _nearest_case("a bfloat16 table [2000, 64], query = row 1999, exclude it, k 6", tb, tb[1999], 6, [1999],
                      _tolerance(torch.bfloat16)),
    ]
    if table is not None and tokenizer is not None:
        def one(word: str) -> int:
            ids = tokenizer.encode(word)
            assert len(ids) == 1, f"{word!r} is {len(ids)} tokens"
            return ids[0]

        tol, prepared = _tolerance(table.dtype), _prepare(table)
        label = f"the model's table [{table.shape[0]:,}, {table.shape[1]}] ({str(table.dtype).removeprefix('torch.')})"
        for word in (" London", " seven", " happy"):
            i = one(word)
            cases.append(_nearest_case(f"{label}: neighbours of {word!r}, k 5", table, table[i], 5, [i], tol,
                                       prepared))
        a, b, c = one(" Paris"), one(" France"), one(" Italy")
        query = (table[a].float() - table[b].float() + table[c].float()).to(table.dtype)
        cases.append(_nearest_case(f"{label}: ' Paris' - ' France' + ' Italy', exclude all three, k 3", table,
                                   query, 3, [a, b, c], tol, prepared))
    return run_checks("check_nearest_neighbours", fn, cases)
