"""The chapter 2 figures: right titles, labels and data."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.config import ModelConfig  # noqa: E402
from course_lib.model import rope_inv_freq  # noqa: E402
from course_lib.viz import positions  # noqa: E402


@pytest.fixture
def config():
    return ModelConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, rope_theta=10000.0, max_position_embeddings=512, name="tiny")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_rope_frequency_plot_shows_frequencies_and_wavelengths(config):
    fig = positions.rope_frequency_plot(config)
    ax_f, ax_w = fig.axes
    inv = rope_inv_freq(config).numpy()
    np.testing.assert_allclose(ax_f.lines[0].get_ydata(), inv)
    np.testing.assert_allclose(ax_w.lines[0].get_ydata(), 2 * math.pi / inv, rtol=1e-6)
    assert ax_f.get_yscale() == "log" and ax_w.get_yscale() == "log"
    assert "radians / token" in ax_f.get_ylabel()
    assert "tokens" in ax_w.get_ylabel()
    assert ax_w.lines[1].get_ydata()[0] == 512  # the context length line
    assert "head_dim 16" in fig._suptitle.get_text()
    assert len(inv) == config.head_dim // 2


def test_rope_rotation_plot_places_points_on_the_circle():
    inv = torch.tensor([1.0, 0.1])
    fig = positions.rope_rotation_plot(inv, pairs=[0, 1], positions=[0, 1, 2])
    assert len(fig.axes) == 2
    pts = fig.axes[0].collections[0].get_offsets()
    np.testing.assert_allclose(pts[2], [math.cos(2.0), math.sin(2.0)], atol=1e-7)
    assert fig.axes[1].get_title().startswith("pair 1")


def test_encoding_heatmap_keeps_the_table():
    table = torch.arange(12.0).reshape(3, 4)
    fig = positions.encoding_heatmap(table, title="PE")
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.images[0].get_array(), table.numpy())
    assert ax.get_title() == "PE"
    assert "position" in ax.get_ylabel() and "dimension" in ax.get_xlabel()


def test_score_heatmap_is_centred_on_zero():
    scores = torch.tensor([[1.0, -3.0], [2.0, 0.5]])
    fig = positions.score_heatmap(scores)
    im = fig.axes[0].images[0]
    assert im.get_clim() == (-3.0, 3.0)
    assert "key position" in fig.axes[0].get_xlabel()


def test_score_vs_offset_plot_has_one_line_per_curve():
    fig = positions.score_vs_offset_plot(np.arange(5), {"a": np.ones(5), "b": np.zeros(5)}, title="T")
    ax = fig.axes[0]
    assert [l.get_label() for l in ax.lines] == ["a", "b"]
    assert ax.get_title() == "T" and "offset" in ax.get_xlabel()


def test_matrix_heatmap_rejects_non_2d():
    with pytest.raises(ValueError, match="2-D"):
        positions.matrix_heatmap(np.zeros(3), title="", xlabel="", ylabel="", cbar_label="")


def test_offset_comparison_plot_has_one_panel_per_scheme():
    offsets = np.arange(4)
    panels = {"added": {"key at 0": np.arange(4.0), "key at 9": np.ones(4)},
              "rotated": {"key at 0": np.zeros(4), "key at 9": np.zeros(4)}}
    fig = positions.offset_comparison_plot(offsets, panels, title="T")
    left, right = fig.axes
    assert left.get_title() == "added" and right.get_title() == "rotated"
    assert [l.get_label() for l in left.lines] == ["key at 0", "key at 9"]
    np.testing.assert_array_equal(left.lines[0].get_ydata(), np.arange(4.0))
    assert left.lines[0].get_linestyle() != left.lines[1].get_linestyle()  # coinciding curves stay visible
    assert left.get_shared_y_axes().joined(left, right)
    assert "offset" in right.get_xlabel() and "q . k" in left.get_ylabel()


def test_mean_direction_plot_draws_every_token_and_bin_medians():
    values = np.linspace(-1, 1, 100)
    fig = positions.mean_direction_plot(values, marked={"rare": 90}, bins=4)
    ax = fig.axes[0]
    assert len(ax.collections[0].get_offsets()) == 100  # one dot per token
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [np.median(values[a:a + 25]) for a in range(0, 100, 25)])
    assert [t.get_text() for t in ax.texts] == ["rare"]
    assert "token id" in ax.get_xlabel() and "cosine" in ax.get_ylabel()
