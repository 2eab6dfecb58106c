"""The chapter 3 figures and the widget's plain callbacks."""
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.viz import attention as viz  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def fake_weights(layers=2, heads=3, seq=4):
    torch.manual_seed(0)
    scores = torch.randn(layers, 1, heads, seq, seq)
    mask = torch.ones(seq, seq, dtype=torch.bool).tril()
    w = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return {i: w[i] for i in range(layers)}


def test_attention_heatmap_shows_the_chosen_layer_and_head():
    w = fake_weights()
    tokens = ["The", " cat", " sat", "\n"]
    fig = viz.attention_heatmap(w, tokens, layer=1, head=2)
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), w[1][0, 2].numpy())
    assert ax.get_title() == "Attention weights, layer 1, head 2"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["The", "␣cat", "␣sat", "↵"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["The", "␣cat", "␣sat", "↵"]
    assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel()


def test_attention_heatmap_accepts_transformers_tuples():
    w = fake_weights()
    fig = viz.attention_heatmap(tuple(w.values()), list("abcd"), layer=0, head=0)
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), w[0][0, 0].numpy())


def test_attention_heatmap_checks_its_inputs():
    w = fake_weights()
    with pytest.raises(ValueError, match="head 5 out of range"):
        viz.attention_heatmap(w, list("abcd"), layer=0, head=5)
    with pytest.raises(ValueError, match="3 tokens"):
        viz.attention_heatmap(w, list("abc"), layer=0, head=0)


def test_token_labels_draw_without_missing_glyph_warnings():
    labels = viz.token_labels(["中", " x", "<e4 b8>"])
    assert labels[0] == "U+4E2D" and labels[1] == "␣x"
    fig, ax = plt.subplots()
    ax.set_xticks(range(3), labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.canvas.draw()


def test_heads_grid_has_one_panel_per_head():
    w = fake_weights(heads=4)
    fig = viz.attention_heads_grid(w, list("abcd"), layer=0, cols=3)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titled == ["head 0", "head 1", "head 2", "head 3"]
    assert "layer 0" in fig._suptitle.get_text()


def test_kv_memory_plot_bars_are_in_kib():
    fig = viz.kv_memory_plot({"MHA": 4096, "GQA": 1024})
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [4.0, 1.0]
    assert "KiB" in ax.get_xlabel()


class _Tok:
    def encode(self, text):
        return [0, 1, 2]

    def token_bytes(self, i):
        return [b"Hi", b"\xe4\xb8", b"\xad"][i]


class _Model:
    device = torch.device("cpu")

    def __call__(self, ids, kv):
        q = torch.randn(1, ids.shape[1], 2, 4)
        for layer in range(2):
            kv.attend(layer, q, q[:, :, :1], q[:, :, :1])


def test_token_strings_show_partial_utf8_as_bytes():
    assert viz.token_strings(_Tok(), [0, 1, 2]) == ["Hi", "<e4 b8>", "<ad>"]


def test_attention_for_prompt_returns_weights_per_layer():
    weights, tokens = viz.attention_for_prompt(_Model(), _Tok(), "ignored")
    assert sorted(weights) == [0, 1] and weights[1].shape == (1, 2, 3, 3)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(1, 2, 3))
    assert tokens == ["Hi", "<e4 b8>", "<ad>"]


def test_attention_widget_builds_and_redraws():
    from types import SimpleNamespace

    model = _Model()
    model.config = SimpleNamespace(num_layers=2, num_heads=2)
    box = viz.attention_widget(model, _Tok(), "ignored")
    text, sliders, _ = box.children
    layer, head = sliders.children
    assert (layer.max, head.max) == (1, 1)
    layer.value, head.value = 1, 1  # redraws through attention_heatmap without error
    text.value = "again"  # recomputes the weights


def test_gqa_diagram_links_each_query_head_to_its_kv_head():
    fig = viz.gqa_sharing_diagram(9, [9, 3, 1], head_dim=64, num_layers=30, dtype=torch.bfloat16)
    assert len(fig.axes) == 3
    for ax, kv in zip(fig.axes, [9, 3, 1]):
        links = sorted(line.get_gid() for line in ax.lines)
        assert links == sorted(f"q{h}->kv{h // (9 // kv)}" for h in range(9))
        boxes = {p.get_gid() for p in ax.patches}
        assert boxes == {f"q{h}" for h in range(9)} | {f"kv{g}" for g in range(kv)}
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("MHA") and titles[1].startswith("GQA, groups of 3") and titles[2].startswith("MQA")
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert "KV cache: 23,040 bytes/token in bfloat16" in texts  # 2 x 30 x 3 x 64 x 2


def test_gqa_diagram_kv_boxes_sit_under_their_group():
    fig = viz.gqa_sharing_diagram(8, [2])
    ax = fig.axes[0]
    for line in ax.lines:
        (xq, xkv), _ = line.get_data()
        h, g = (int(s) for s in line.get_gid().removeprefix("q").split("->kv"))
        assert g == h // 4
        assert xkv == pytest.approx((g + 0.5) * 4)  # the middle of query heads 4g .. 4g+3


def test_gqa_diagram_rejects_uneven_groups():
    with pytest.raises(ValueError, match="evenly"):
        viz.gqa_sharing_diagram(9, [2])


def test_memory_vs_length_plot_draws_formulas_measurements_and_limits():
    lens = [1024, 4096, 16384]
    fig = viz.memory_vs_length_plot(lens, {"scores [seq, seq]": [4 * n * n for n in lens],
                                           "tile": [32768.0] * 3},
                                    measured={"naive": [5e6, 7e7]}, measured_lens=[1024, 4096],
                                    on_chip_bytes={"228 KiB shared memory per SM": 228 * 1024})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "MiB" in ax.get_ylabel() and "tokens" in ax.get_xlabel()
    data = {line.get_label(): line.get_ydata() for line in ax.lines}
    np.testing.assert_allclose(data["scores [seq, seq]"], [4 * n * n / 2**20 for n in lens])
    np.testing.assert_allclose(data["naive: measured peak"], [5e6 / 2**20, 7e7 / 2**20])
    assert any(t.get_text() == "228 KiB shared memory per SM" for t in ax.texts)
    fig = viz.memory_vs_length_plot(lens, {"naive": [1.0, 2.0, 3.0]}, measured={"naive": [1.5]}, measured_lens=[1024])
    line, marker = fig.axes[0].lines
    assert marker.get_color() == line.get_color()  # a measurement takes the colour of its formula
    with pytest.raises(ValueError, match="values for 3 lengths"):
        viz.memory_vs_length_plot(lens, {"bad": [1.0]})
