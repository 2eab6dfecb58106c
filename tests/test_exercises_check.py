"""The runner every checker shares: a wrong value, an unreadable value and an unattempted stub each fail cleanly."""
from __future__ import annotations

from course_lib.exercises import Case, run_checks


def _equals_three(got):
    assert int(got) == 3, f"expected 3, got {got}"


CASES = [Case("returns three", (), _equals_three)]


def test_right_wrong_unreadable_and_stub(capsys):
    assert run_checks("demo", lambda: 3, CASES)
    assert not run_checks("demo", lambda: 4, CASES)
    assert "✗ returns three: expected 3, got 4" in capsys.readouterr().out
    assert not run_checks("demo", lambda: "three", CASES)  # int("three") raises ValueError inside verify
    assert "could not read the returned value 'three': ValueError" in capsys.readouterr().out

    def stub():
        raise NotImplementedError

    assert not run_checks("demo", stub, CASES)
    assert "not attempted" in capsys.readouterr().out


def test_a_timed_case_may_miss_once_but_a_mistake_misses_every_attempt(capsys):
    """`attempts`: a correct answer that one noisy run pushed out of tolerance passes on the next run; a wrong one
    is called as many times as allowed and still fails, with its reason."""
    calls = []

    def noisy_then_right():
        calls.append(1)
        return 4 if len(calls) == 1 else 3

    timed = [Case("returns three", (), _equals_three, attempts=3)]
    assert run_checks("demo", noisy_then_right, timed) and len(calls) == 2
    assert "✓ returns three" in capsys.readouterr().out
    calls.clear()
    assert not run_checks("demo", lambda: calls.append(1) or 4, timed) and len(calls) == 3
    out = capsys.readouterr().out  # (pytest adds its own lines to the message of an assert in a test file)
    assert "✗ returns three: expected 3, got 4" in out and "(in each of 3 attempts)" in out
    calls.clear()
    assert not run_checks("demo", noisy_then_right, CASES) and len(calls) == 1  # one attempt unless asked
