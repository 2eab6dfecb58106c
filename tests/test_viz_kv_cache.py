"""The chapter 6 figures: right data, labels and titles."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_lib.viz import kv_cache as viz  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_generation_cost_plots_steps_and_cumulative_time():
    no, yes = [0.1, 0.2, 0.3], [0.1, 0.1, 0.1]
    fig = viz.plot_generation_cost(no, yes, prompt_len=5, title="t, cpu")
    ax_step, ax_cum = fig.axes
    np.testing.assert_allclose(ax_step.lines[0].get_xdata(), [5, 6, 7])
    np.testing.assert_allclose(ax_step.lines[0].get_ydata(), [100, 200, 300])
    np.testing.assert_allclose(ax_cum.lines[0].get_ydata(), [0.1, 0.3, 0.6])
    np.testing.assert_allclose(ax_cum.lines[1].get_ydata(), [0.1, 0.2, 0.3])
    assert "(ms)" in ax_step.get_ylabel() and "(s)" in ax_cum.get_ylabel()
    assert fig._suptitle.get_text() == "t, cpu"
    with pytest.raises(ValueError):
        viz.plot_generation_cost([0.1], [0.1, 0.2], prompt_len=1)


def test_stacked_bars_stack_parts_and_draw_limits():
    rows = {"a": {"weights": 10.0, "KV cache": 5.0}, "b": {"weights": 1.0, "KV cache": 2.0, "activations": 0.5}}
    fig = viz.plot_stacked_bars(rows, unit="GB", title="budget", lines={"80 GB": 80})
    ax = fig.axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths == [10.0, 1.0, 5.0, 2.0, 0.0, 0.5]  # part by part, row by row
    assert [p.get_x() for p in ax.patches][2:4] == [10.0, 1.0]  # KV starts where the weights end
    assert any(line.get_xdata()[0] == 80 for line in ax.lines)
    assert "(GB)" in ax.get_xlabel() and ax.get_title() == "budget"


def test_memory_map_draws_used_inside_reserved():
    fig = viz.plot_memory_map({"pool": [(0, 10, 4), (20, 10, 10)]}, pool_tokens=40, title="map")
    ax = fig.axes[0]
    bars = [(p.get_x(), p.get_width()) for p in ax.patches]
    assert bars == [(0, 40), (0, 10), (0, 4), (20, 10), (20, 10)]
    assert ax.get_xlim() == (0, 40) and "token slots" in ax.get_xlabel()


def test_block_tables_label_physical_blocks_and_shared_ones():
    snaps = [("step 1", {"A": ([3, 0], 6), "B": ([3, 1], 5)})]
    fig = viz.plot_block_tables(snaps, num_blocks=4, block_size=4, title="tables")
    ax_t, ax_p = fig.axes
    assert [t.get_text() for t in ax_t.texts] == ["3", "0", "3", "1"]
    physical = [t.get_text() for t in ax_p.texts]
    assert physical[3] == "3\nA+B" and physical[2] == "2"  # block 3 shared, block 2 free
    assert fig._suptitle.get_text() == "tables"


def test_ttft_pairs_in_milliseconds():
    fig = viz.plot_ttft_pairs([0.5, 0.4], [0.5, 0.1], title="ttft")
    ax = fig.axes[0]
    assert [p.get_height() for p in ax.patches] == pytest.approx([500, 400, 500, 100])
    assert "(ms)" in ax.get_ylabel()
