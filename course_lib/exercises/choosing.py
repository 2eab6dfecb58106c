"""Checkers for chapter 11 (choosing an engine): ITL vs TPOT, the decision table, a format that fits.

    check_itl_and_tpot(itl_and_tpot)          # (chunk_times, output_tokens) per request -> (mean ITL, mean TPOT)
    check_table_cell(table_cell)              # a situation -> (hardware, users), a cell of the decision table
    check_best_format(best_format)            # the widest weight format that fits a card for N users
"""
from __future__ import annotations

import math
from typing import Callable

from ..planner.engines import HARDWARE, USERS, cell_text
from .check import Case, run_checks

# (chunk_times, output_tokens) of three requests as a client saw them (seconds): a short fast one, a long one
# whose chunks carry one token each, and one whose chunks carry two tokens each (a server that sends a step's
# text for two tokens at once, or holds back half a UTF-8 character).
REQUESTS = [([0.20, 0.22, 0.24], 3),
            ([0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70], 9),
            ([0.25, 0.33, 0.41, 0.49], 7)]


def reference_itl_and_tpot(requests: list[tuple[list[float], int]]) -> tuple[float, float]:
    """Mean ITL over every gap of every request (vLLM's histogram: one sample a gap); mean TPOT over requests
    (one sample a request: (last - first) / (output tokens - 1))."""
    gaps = [b - a for times, _ in requests for a, b in zip(times, times[1:])]
    tpots = [(times[-1] - times[0]) / (tokens - 1) for times, tokens in requests]
    return sum(gaps) / len(gaps), sum(tpots) / len(tpots)


def check_itl_and_tpot(fn: Callable[[list[tuple[list[float], int]]], tuple[float, float]]) -> bool:
    """`fn(requests) -> (mean ITL, mean TPOT)` in seconds; `requests` is a list of (chunk_times, output_tokens)."""

    def close_to(expected: tuple[float, float]) -> Callable:
        def verify(got) -> None:
            itl, tpot = (float(v) for v in got)
            assert math.isclose(itl, expected[0], rel_tol=1e-6), \
                f"mean ITL: expected {expected[0] * 1e3:.3f} ms (every gap of every request), got {itl * 1e3:.3f} ms"
            assert math.isclose(tpot, expected[1], rel_tol=1e-6), \
                (f"mean TPOT: expected {expected[1] * 1e3:.3f} ms (one (last - first) / (tokens - 1) per request), "
                 f"got {tpot * 1e3:.3f} ms")
        return verify

    one_token_chunks = REQUESTS[:2]
    cases = [Case("one token a chunk, two requests of different lengths", (one_token_chunks,),
                  close_to(reference_itl_and_tpot(one_token_chunks))),
             Case("a request whose chunks carry two tokens each: ITL is a chunk's gap, TPOT a token's",
                  ([REQUESTS[2]],), close_to(reference_itl_and_tpot([REQUESTS[2]]))),
             Case("all three: ITL weighs the long request by its gaps, TPOT gives each request one vote",
                  (REQUESTS,), close_to(reference_itl_and_tpot(REQUESTS)))]
    return run_checks("itl_and_tpot", fn, cases)


SITUATIONS = [  # (situation, the cell it belongs to)
    ({"apple_silicon": False, "gpus": 0, "gpu_class": None, "nvlink": False, "users": 1}, ("laptop CPU", "one")),
    ({"apple_silicon": True, "gpus": 0, "gpu_class": None, "nvlink": False, "users": 1}, ("Apple silicon", "one")),
    ({"apple_silicon": True, "gpus": 0, "gpu_class": None, "nvlink": False, "users": 8}, ("Apple silicon", "a team")),
    ({"apple_silicon": False, "gpus": 0, "gpu_class": None, "nvlink": False, "users": 300}, ("laptop CPU", "many")),
    ({"apple_silicon": False, "gpus": 1, "gpu_class": "consumer", "nvlink": False, "users": 1},
     ("one consumer GPU", "one")),
    ({"apple_silicon": False, "gpus": 1, "gpu_class": "consumer", "nvlink": False, "users": 20},
     ("one consumer GPU", "a team")),
    ({"apple_silicon": False, "gpus": 1, "gpu_class": "data-centre", "nvlink": False, "users": 500},
     ("one data-centre GPU", "many")),
    ({"apple_silicon": False, "gpus": 8, "gpu_class": "data-centre", "nvlink": True, "users": 1},
     ("several GPUs over NVLink", "one")),
    ({"apple_silicon": False, "gpus": 4, "gpu_class": "consumer", "nvlink": False, "users": 200},
     ("several GPUs over PCIe", "many")),
    ({"apple_silicon": False, "gpus": 2, "gpu_class": "data-centre", "nvlink": False, "users": 10},
     ("several GPUs over PCIe", "a team")),
]


def reference_table_cell(situation: dict) -> tuple[str, str]:
    """Apple silicon first; then no GPU -> laptop CPU, 2+ GPUs -> several by their link, else by class;
    users 1 / 2-20 / more."""
    if situation["apple_silicon"]:
        hardware = "Apple silicon"
    elif situation["gpus"] == 0:
        hardware = "laptop CPU"
    elif situation["gpus"] > 1:
        hardware = "several GPUs over NVLink" if situation["nvlink"] else "several GPUs over PCIe"
    else:
        hardware = "one data-centre GPU" if situation["gpu_class"] == "data-centre" else "one consumer GPU"
    n = situation["users"]
    return hardware, "one" if n == 1 else "a team" if n <= 20 else "many"


def check_table_cell(fn: Callable[[dict], tuple[str, str]]) -> bool:
    """`fn(situation) -> (hardware, users)`: the decision table's cell (HARDWARE x USERS) for a situation."""

    def cell(expected: tuple[str, str]) -> Callable:
        def verify(got) -> None:
            hardware, users = got
            assert hardware in HARDWARE, f"hardware must be one of {HARDWARE}, got {hardware!r}"
            assert users in USERS, f"users must be one of {USERS}, got {users!r}"
            assert (hardware, users) == expected, \
                f"expected {expected} ({cell_text(*expected)}), got {(hardware, users)}"
        return verify

    cases = [Case(f"{s} -> {cell_text(*c)}", (dict(s),), cell(c)) for s, c in SITUATIONS]
    return run_checks("table_cell", fn, cases)


CANDIDATES = ("bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")  # widest first
FORMAT_CASES = [("Llama-3-8B", "T4", 1, 8192), ("Llama-3-8B", "T4", 8, 8192), ("Llama-3-8B", "A100-80GB", 16, 8192),
                ("Llama-3-70B", "H100 SXM", 1, 4096), ("Llama-3-70B", "H200", 16, 8192),
                ("Llama-3-70B", "RTX 4090", 1, 4096)]


def reference_best_format(model: str, device: str, users: int, context_len: int,
                          candidates: tuple[str, ...] = CANDIDATES) -> str | None:
    """The first (widest) of `candidates` whose plan fits, or None when none does."""
    from ..planner import plan

    for name in candidates:
        if plan(model, device, weight_format=name, context_len=context_len, concurrency=users).fits:
            return name
    return None


def check_best_format(fn: Callable[[str, str, int, int], str | None]) -> bool:
    """`fn(model, device, users, context_len) -> format`: the widest of CANDIDATES that fits, None if none."""

    def equals(expected: str | None) -> Callable:
        def verify(got) -> None:
            assert got == expected, (f"expected {expected!r} (the widest of {CANDIDATES} whose plan fits), "
                                     f"got {got!r}")
        return verify

    cases = [Case(f"{model} on {device}, {users} user{'s' * (users > 1)} x {context:,} tokens", (model, device, users,
                  context), equals(reference_best_format(model, device, users, context)))
             for model, device, users, context in FORMAT_CASES]
    return run_checks("best_format", fn, cases)
