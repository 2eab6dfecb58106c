"""course_lib.viz.batching: notebook 07's interleaved best-of-n runner and its static/continuous picture."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.viz.batching import best_of_interleaved, plot_schedule_pair  # noqa: E402


def test_best_of_interleaved_runs_in_turn_and_keeps_the_best():
    calls = []
    scores = iter([5, 1, 3, 9, 2, 4])

    def make(name):
        def fn():
            calls.append(name)
            return next(scores)
        return fn

    best = best_of_interleaved({"a": make("a"), "b": make("b")}, repeats=3, key=lambda r: r)
    assert calls == ["a", "b"] * 3  # interleaved, one of each per round
    assert best["a"][1] == 2 and best["b"][1] == 1  # the smallest key per name
    assert all(seconds >= 0 for seconds, _ in best.values())


def test_best_of_interleaved_by_time_and_bad_repeats():
    best = best_of_interleaved({"x": lambda: "done"}, repeats=2)
    assert best["x"][1] == "done" and best["x"][0] >= 0
    with pytest.raises(ValueError):
        best_of_interleaved({"x": lambda: None}, repeats=0)


def test_plot_schedule_pair_shares_the_step_scale():
    static = [["prefill", "decode", "padding"], ["prefill", "decode", "decode"]]
    continuous = [["prefill", "decode"], ["prefill", "decode"]]
    fig = plot_schedule_pair([2, 3], static, continuous, batch_size=2)
    top, bottom = fig.axes[:2]
    assert top.get_xlim() == bottom.get_xlim()
    assert "B = 2" in top.get_title()
    plt.close(fig)
