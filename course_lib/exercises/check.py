"""The runner every checker uses: cases in, one readable line per case out."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Case:
    """One check of a learner's function: call it with `args`, then `verify(result)` asserts what must hold."""

    description: str
    args: tuple
    verify: Callable[[Any], None]  # raises AssertionError with a message a learner can act on


def run_checks(name: str, fn: Callable, cases: list[Case]) -> bool:
    """Run every case; print ✓/✗ per case, or "not attempted" if `fn` raises NotImplementedError."""
    passed = 0
    for case in cases:
        try:
            result = fn(*case.args)
        except NotImplementedError:
            print(f"{name}: not attempted yet (the function still raises NotImplementedError)")
            return False
        except Exception as e:  # noqa: BLE001 - a learner's bug is reported, not raised
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"✗ {case.description}: {type(e).__name__}: {e} (line {where.lineno})")
            continue
        try:
            case.verify(result)
        except AssertionError as e:
            print(f"✗ {case.description}: {e}")
            continue
        passed += 1
        print(f"✓ {case.description}")
    print(f"{name}: {passed}/{len(cases)} checks passed")
    return passed == len(cases)
