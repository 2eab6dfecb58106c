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
