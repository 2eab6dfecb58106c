"""The runner every checker uses: cases in, one readable line per case out."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..host import echo


@dataclass
class Case:
    """One check of a learner's function: call it with `args`, then `verify(result)` asserts what must hold.

    A case that checks timings takes `attempts` > 1: a noisy second on a shared machine can push a correct answer
    out of its tolerance once, while a mistake (a ratio inverted, the wrong quantity) misses on every attempt."""

    description: str
    args: tuple
    verify: Callable[[Any], None]  # raises AssertionError with a message a learner can act on; any other
    # exception means the returned value could not be read, and fails the case too
    attempts: int = 1

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Case.attempts must be >= 1, got {self.attempts}")


class NotAttempted(Exception):
    """The learner's function still raises NotImplementedError."""


def _passes(fn: Callable, case: Case) -> bool:
    """Run one case, up to `case.attempts` times while its result misses; print ✓, or ✗ with the last reason."""
    for _ in range(case.attempts):
        try:
            result = fn(*case.args)
        except NotImplementedError:
            raise NotAttempted from None
        except Exception as e:  # noqa: BLE001 - a learner's bug is reported, not raised
            where = traceback.extract_tb(e.__traceback__)[-1]
            echo(f"✗ {case.description}: {type(e).__name__}: {e} (line {where.lineno})")
            return False
        try:
            case.verify(result)
        except AssertionError as e:
            missed = e  # a timed case tries again
            continue
        except Exception as e:  # noqa: BLE001 - an odd return value (a str where a list belongs) fails its case
            shown = repr(result)
            shown = shown if len(shown) <= 120 else shown[:117] + "..."
            echo(f"✗ {case.description}: could not read the returned value {shown}: {type(e).__name__}: {e}")
            return False
        echo(f"✓ {case.description}")
        return True
    echo(f"✗ {case.description}: {missed}" + (f" (in each of {case.attempts} attempts)" if case.attempts > 1 else ""))
    return False


def run_checks(name: str, fn: Callable, cases: list[Case]) -> bool:
    """Run every case; print ✓/✗ per case, or "not attempted" if `fn` raises NotImplementedError."""
    passed = 0
    for case in cases:
        try:
            passed += _passes(fn, case)
        except NotAttempted:
            echo(f"{name}: not attempted yet (the function still raises NotImplementedError)")
            return False
    echo(f"{name}: {passed}/{len(cases)} checks passed")
    return passed == len(cases)


def seeded_randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Random tensor from its own generator: the learner's global seed is left alone."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def as_int(result: object, what: str) -> int:
    """A learner's integer result (an int or a one-element integer tensor), or an AssertionError saying so."""
    if isinstance(result, torch.Tensor) and result.numel() == 1 and not result.is_floating_point():
        result = int(result.item())
    assert isinstance(result, int) and not isinstance(result, bool), \
        f"return {what} as an int, got {type(result).__name__} {result!r}"
    return result


def as_int_list(result: object, what: str) -> list[int]:
    """A learner's integers (a list, a tuple or an integer tensor), or an AssertionError saying so."""
    if isinstance(result, torch.Tensor):
        assert not result.is_floating_point(), f"return {what} as integers, got a {result.dtype} tensor"
        return [int(v) for v in result.flatten().tolist()]
    assert isinstance(result, (list, tuple)), f"return {what} as a list of ints, got {type(result).__name__}"
    for v in result:
        assert isinstance(v, int) or (isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point()), \
            f"return {what} as a list of ints, got an element {v!r}"
    return [int(v) for v in result]
