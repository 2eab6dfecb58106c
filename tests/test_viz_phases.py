"""course_lib.viz.phases: the pictures of notebook 05, drawn from synthetic numbers."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.profiling.flops import StepCost  # noqa: E402
from course_lib.profiling.metrics import RequestMetrics  # noqa: E402
from course_lib.profiling.roofline import Ceilings, RooflinePoint  # noqa: E402
from course_lib.profiling.timer import Timing  # noqa: E402
from course_lib.viz import phases  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(fig) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in [*ax.texts, ax.title])


def test_phase_shapes_name_both_products():
    fig = phases.plot_phase_shapes(30, 576, 1536, token_labels=[f"t{i}" for i in range(30)])
    text = _texts(fig)
    assert "X [30, 576]" in text and "X [1, 576]" in text and "W^T [576, 1536]" in text
    assert "(14 more rows not drawn)" in text  # 16 rows drawn by default
    assert "each weight used 30x" in text and "each weight used 1x" in text


def test_request_timeline_marks_ttft_and_tpot():
    m = RequestMetrics(arrival_time=0.0)
    m.record_scheduled(0.01)
    for t in (0.5, 0.55, 0.6, 0.65):
        m.record_token(t)
    fig = phases.plot_request_timeline(m, ["1", "2", "3", "4"], prompt_tokens=300)
    text = _texts(fig)
    assert "TTFT = 500 ms" in text and "TPOT 50 ms" in text and "300 prompt tokens" in text


def _point(name: str, flops: int, nbytes: int, seconds: float) -> RooflinePoint:
    return RooflinePoint(name, StepCost(flops, nbytes), Timing.from_samples([seconds]))


def test_time_floors_and_their_plot():
    ceilings = Ceilings(peak_flops=100e9, bandwidth=10e9)
    prefill = _point("prefill", flops=100_000_000_000, nbytes=1_000_000_000, seconds=1.25)  # floors 1 s and 0.1 s
    decode = _point("decode", flops=200_000_000, nbytes=500_000_000, seconds=0.1)  # floors 2 ms and 50 ms
    assert phases.time_floors(prefill, ceilings) == pytest.approx({"compute": 1.0, "memory": 0.1, "measured": 1.25})
    assert phases.time_floors(decode, ceilings) == pytest.approx({"compute": 0.002, "memory": 0.05, "measured": 0.1})
    fig = phases.plot_time_floors([prefill, decode], ceilings)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["prefill", "decode"]


def test_forward_pass_grid_counts_what_each_pass_computes_and_reads():
    g = phases.forward_pass_grid(5, 4)  # a 5-token prompt, 4 output tokens
    assert g.shape == (4, 8)  # the last output token is never fed back
    assert (g[0] == phases.PREFILL).sum() == 5 and (g[0] == phases.EMPTY).sum() == 3
    assert [(row == phases.DECODE).sum() for row in g[1:]] == [1, 1, 1]
    assert [(row == phases.CACHED).sum() for row in g[1:]] == [5, 6, 7]  # each step reads everything before it
    assert g[3, 7] == phases.DECODE
    with pytest.raises(ValueError):
        phases.forward_pass_grid(0, 3)


def test_forward_passes_plot_labels_each_pass():
    fig = phases.plot_forward_passes(6, ["'The'", "' sky'", "'<|im_end|>'"], title="t")
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (3, 8)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["prefill (6 tokens)", "decode step 1", "decode step 2"]
    assert "-> ' sky'" in _texts(fig)


def test_prompt_cost_writes_the_ratio():
    fig = phases.plot_prompt_cost([1, 10], [0.05, 0.1], 0.05)
    text = _texts(fig)
    assert "1.0x" in text and "5.0x" in text  # 10 decode steps of 50 ms against one 100 ms prefill
    with pytest.raises(ValueError):
        phases.plot_prompt_cost([1, 10], [0.05], 0.05)


def test_ttft_and_tpot_panels_carry_every_series_and_floor():
    import pandas as pd

    per_len = pd.DataFrame({"ttft": [0.01, 0.02, 0.04], "tpot": [0.005, 0.005, 0.006]}, index=[32, 64, 128])
    fig = phases.plot_ttft_and_tpot(per_len, [64, 512], [0.004, 0.005], [5, 10, 20], [2, 3], "cpu, float32")
    left, right = fig.axes
    assert "TTFT" in left.get_title() and "cpu, float32" in right.get_title()
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert sum("roofline floor" in s for s in labels) == 2 and any("engine" in s for s in labels)
    assert len(left.collections) == 1 and len(right.collections) == 2  # one scatter, then two
