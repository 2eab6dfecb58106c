"""Checkers for chapter 02's embeddings (词嵌入): the bytes of a table in GGUF formats, nearest neighbours.

Each one tests the learner's function on inputs the chapter does not use, against the GGUF file or float cosines:

    check_table_bytes(gguf_table_bytes)                    # vs the tensors of the course's GGUF file and gguf's sizes
    check_nearest_neighbours(nearest, table, tokenizer)    # vs float cosines, on random tables and the model's
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import torch

from .check import Case, as_int, as_int_list, run_checks, seeded_randn


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
        got = as_int(result, "the number of bytes")
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
        got = as_int_list(result, "the neighbours' ids")
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
                      seeded_randn(24, seed=42), 3, [], 1e-9),
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
