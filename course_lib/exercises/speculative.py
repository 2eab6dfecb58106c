"""Checkers for chapter 12 (speculative decoding): prompt lookup, greedy acceptance, tokens a step.

    check_ngram_propose(ngram_propose)        # (token_ids, k, n_max, n_min) -> the tokens after the last n-gram's match
    check_greedy_accept(greedy_accept)        # (target_choice, drafts) -> the tokens a greedy step emits
    check_tokens_per_step(tokens_per_step)    # (acceptance rate a, k) -> expected tokens a verification step emits
"""
from __future__ import annotations

import math
from typing import Callable

from ..engine import speculative
from .check import Case, run_checks

PROPOSE_CASES = [  # (token_ids, k, n_max, n_min, what it checks)
    ([5, 6, 7, 8, 9, 5, 6], 3, 4, 2, "the bigram 5 6 occurred before: propose what followed it"),
    ([5, 6, 7, 8, 9, 5, 6], 1, 4, 2, "at most k tokens"),
    ([1, 2, 3, 4, 1, 2, 3], 2, 3, 2, "the longest n first: 1 2 3 matched with n = 3"),
    ([1, 2, 9, 2, 7, 1, 2], 2, 2, 1, "n = 2 (1 2) is tried before n = 1 (2)"),
    ([3, 4, 8, 3, 4, 9, 3, 4], 2, 2, 2, "several earlier matches: the most recent one (3 4 9 ...)"),
    ([1, 2, 3, 4, 5], 4, 4, 2, "no earlier occurrence: []"),
    ([7, 8, 7, 8], 4, 4, 2, "the match may run into the tail itself: fewer than k tokens left"),
    ([4, 4, 4, 4], 3, 3, 1, "never match the tail with itself"),
]


def check_ngram_propose(fn: Callable[[list[int], int, int, int], list[int]]) -> bool:
    """`fn(token_ids, k, n_max, n_min)`: prompt lookup's drafts, as `course_lib.engine.speculative.ngram_propose`."""

    def same_as(expected: list[int]) -> Callable:
        def verify(got) -> None:
            assert [int(t) for t in got] == expected, f"expected {expected}, got {list(got)}"
        return verify

    cases = [Case(f"{what}: {ids}, k={k}", (list(ids), k, n_max, n_min),
                  same_as(speculative.ngram_propose(list(ids), k, n_max, n_min)))
             for ids, k, n_max, n_min, what in PROPOSE_CASES]
    return run_checks("ngram_propose", fn, cases)


ACCEPT_CASES = [  # (target_choice, drafts, what it checks)
    ([11, 12, 13, 14], [11, 12, 13], "every draft accepted: the model's next token comes free"),
    ([11, 20, 13, 14], [11, 12, 13], "the second draft rejected: keep the first, emit the model's token, stop"),
    ([20, 12, 13, 14], [11, 12, 13], "the first draft rejected: one token, the model's"),
    ([11, 12, 30, 14], [11, 12, 13], "a later draft that happens to match after a rejection does not count"),
    ([42], [], "no drafts: a plain decode step"),
]


def check_greedy_accept(fn: Callable[[list[int], list[int]], list[int]]) -> bool:
    """`fn(target_choice, drafts)`: the tokens a greedy verification step emits."""

    def same_as(expected: list[int]) -> Callable:
        def verify(got) -> None:
            assert [int(t) for t in got] == expected, f"expected {expected}, got {list(got)}"
        return verify

    cases = [Case(f"{what}: choices {c}, drafts {d}", (list(c), list(d)), same_as(speculative.greedy_accept(c, d)))
             for c, d, what in ACCEPT_CASES]
    return run_checks("greedy_accept", fn, cases)


def reference_tokens_per_step(a: float, k: int) -> float:
    """Expected tokens a step emits when each draft is accepted independently with probability a:
    1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a), and k + 1 when a = 1."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def check_tokens_per_step(fn: Callable[[float, int], float]) -> bool:
    """`fn(a, k)`: the expected number of tokens one verification step emits."""

    def close_to(expected: float) -> Callable:
        def verify(got) -> None:
            assert math.isclose(float(got), expected, rel_tol=1e-9), f"expected {expected:.4f}, got {float(got):.4f}"
        return verify

    cases = [Case("a = 0: every draft rejected, one token a step", (0.0, 4), close_to(1.0)),
             Case("a = 1: every draft accepted, k + 1 tokens a step", (1.0, 4), close_to(5.0)),
             Case("a = 0.5, k = 1: 1 + 0.5", (0.5, 1), close_to(1.5)),
             Case("a = 0.8, k = 4: a geometric series, not 1 + k a", (0.8, 4), close_to(reference_tokens_per_step(0.8, 4))),
             Case("a = 0.1, k = 8: a bad guesser gains little from a large k", (0.1, 8),
                  close_to(reference_tokens_per_step(0.1, 8)))]
    return run_checks("tokens_per_step", fn, cases)
