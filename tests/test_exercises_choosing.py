"""Chapter 11: the decision table's data, and the checkers: True on reference solutions, False on mistakes."""
import pytest

from course_lib.exercises import check_best_format, check_itl_and_tpot, check_table_cell
from course_lib.exercises.choosing import REQUESTS, reference_best_format, reference_itl_and_tpot, reference_table_cell
from course_lib.planner import FORMATS
from course_lib.planner.engines import DECISIONS, ENGINES, HARDWARE, USERS, decide, decision_table, placed_engines


def test_every_cell_names_a_known_engine_and_every_engine_is_placed():
    assert set(DECISIONS) == {(h, u) for h in HARDWARE for u in USERS}
    for choice in DECISIONS.values():
        assert {choice.engine, *choice.also} <= set(ENGINES)
    active = {name for name, e in ENGINES.items() if e.status == "active"}
    assert placed_engines() == active  # TGI, in maintenance mode, is the one left out
    assert "maintenance" in ENGINES["TGI"].status
    assert decision_table().shape == (len(HARDWARE), len(USERS))
    with pytest.raises(ValueError, match="hardware"):
        decide("a phone", "one")


def test_formats_in_the_table_are_planner_formats():
    assert {c.weight_format for c in DECISIONS.values()} <= set(FORMATS)


def test_itl_and_tpot_reference_passes_and_mistakes_fail(capsys):
    assert check_itl_and_tpot(reference_itl_and_tpot)

    def per_chunk_tpot(requests):  # divides by chunks, not tokens: wrong where a chunk holds two tokens
        itl, _ = reference_itl_and_tpot(requests)
        return itl, reference_itl_and_tpot([(t, len(t)) for t, _ in requests])[1]

    def itl_per_request(requests):  # averages each request's mean gap: every request one vote, like TPOT
        means = [(t[-1] - t[0]) / (len(t) - 1) for t, _ in requests]
        return sum(means) / len(means), reference_itl_and_tpot(requests)[1]

    assert not check_itl_and_tpot(per_chunk_tpot)
    assert not check_itl_and_tpot(itl_per_request)
    itl, tpot = reference_itl_and_tpot(REQUESTS)
    assert itl != pytest.approx(tpot)
    assert "✗" in capsys.readouterr().out


def test_table_cell_reference_passes_and_mistakes_fail(capsys):
    assert check_table_cell(reference_table_cell)

    def gpu_first(situation):  # ignores Apple silicon
        hardware, users = reference_table_cell({**situation, "apple_silicon": False})
        return hardware, users

    assert not check_table_cell(gpu_first)
    assert not check_table_cell(lambda s: ("a laptop", "one"))
    assert "✗" in capsys.readouterr().out


def test_stubs_are_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert not check_itl_and_tpot(stub)
    assert not check_table_cell(stub)
    assert "not attempted" in capsys.readouterr().out


def test_best_format_reference_passes_and_mistakes_fail(capsys):
    assert check_best_format(reference_best_format)
    assert not check_best_format(lambda *args: "q4_k_m")  # always the smallest common answer
    assert not check_best_format(lambda m, d, u, c: reference_best_format(m, d, 1, c))  # forgets the users' KV
    assert "✗" in capsys.readouterr().out
