"""course_lib.viz.profiling and the profiler helpers behind notebook 09: known inputs, sane figures."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.config import ModelConfig  # noqa: E402
from course_lib.exercises.profiling import _request  # noqa: E402
from course_lib.model import Transformer  # noqa: E402
from course_lib.profiling import summarize  # noqa: E402
from course_lib.profiling.torch_profile import op_category, phase_summary, profile_steps  # noqa: E402
from course_lib.viz import profiling as vp  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("op, family", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::linear", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_efficient_attention_forward", "attention"),
    ("aten::add_", "norm / activation / elementwise"), ("aten::rsqrt", "norm / activation / elementwise"),
    ("aten::index_put_", "copies / indexing"), ("aten::_to_copy", "copies / indexing"),
    ("aten::t", "copies / indexing"), ("aten::arange", "copies / indexing"),
    ("aten::argmax", "other"), ("cudaLaunchKernel", "other"),
])
def test_op_category(op, family):
    assert op_category(op) == family


def test_profile_steps_and_phase_summary():
    cfg = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    ops = profile_steps(model, prompt_len=16, row_limit=None)
    assert set(ops["phase"]) == {"prefill", "decode"}
    assert len(profile_steps(model, prompt_len=16, row_limit=3)) == 6  # top 3 of each phase
    summary = phase_summary(ops)
    for phase, rows in summary.groupby("phase"):
        assert rows["share"].sum() == pytest.approx(1.0)
        assert rows["ms"].sum() == pytest.approx(ops.loc[ops["phase"] == phase, "self_cpu_ms"].sum())
    # every linear layer of both blocks (q, k, v, o, gate, up, down) and the lm_head runs once per phase
    mm = summary[(summary["category"] == "matmul")].set_index("phase")["calls"]
    assert (mm >= 2 * 7 + 1).all()
    fig = vp.plot_top_ops(ops, n=5, title="tiny model")
    assert len(fig.axes) == 2


def test_request_timeline_and_cdf():
    m = _request(0.0, [0.5, 0.6, 0.8, 1.1])
    fig = vp.plot_request_timeline(m, title="one request")
    bottom = fig.axes[1]
    heights = [p.get_height() for p in bottom.patches]
    assert heights == pytest.approx([100, 200, 300])  # the ITLs, in ms
    ax = vp.plot_latency_cdf({"a": [0.01, 0.02, 0.03], "b": [0.05]}, title="cdf")
    assert ax.get_ylim()[1] > 100 and len(ax.get_legend().get_texts()) == 2


def test_load_percentiles_and_memory():
    runs = {c: [_request(0.0, list(0.1 * c + np.arange(1, 5) * 0.05 * c)) for _ in range(c)] for c in (1, 2, 4)}
    sweep = pd.DataFrame([{"concurrency": c, **summarize(r)} for c, r in runs.items()])
    fig = vp.plot_load_percentiles(sweep, title="sweep")
    assert len(fig.axes) == 3
    ttft_p99 = fig.axes[1].get_lines()[2].get_ydata()
    assert ttft_p99 == pytest.approx(sweep["ttft_p99"] * 1e3)
    ax = vp.plot_memory({"weights": 2 ** 20, "KV cache": 2 ** 30, "activations": 2 ** 10},
                        stack={"weights": 2 ** 20, "KV cache": 2 ** 30, "rest": 2 ** 21}, stack_label="RSS")
    widths = [p.get_width() for p in ax.patches]
    assert widths[:3] == pytest.approx([1 / 1024, 1024, 1])  # MiB, last key first
    assert widths[3:] == pytest.approx([1, 1024, 2])  # the stacked bar's segments
    assert vp.short_op_name("aten::_scaled_dot_product_flash_attention_for_cpu") == "sdpa flash for cpu"
    assert vp.short_op_name("aten::mm") == "mm"
