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
