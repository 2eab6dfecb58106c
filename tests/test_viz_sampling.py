"""course_lib.viz.sampling: the functions behind notebook 04's plots and sliders."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.config import ModelConfig  # noqa: E402
from course_lib.model import Transformer  # noqa: E402
from course_lib.viz import sampling as vs  # noqa: E402

PROBS = torch.tensor([0.05, 0.5, 0.15, 0.3])  # token 1 > 3 > 2 > 0
LOGITS = PROBS.log()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_plain_distribution_is_softmax_sorted():
    ids, probs = vs.filtered_distribution(LOGITS)
    assert ids.tolist() == [1, 3, 2, 0]
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3, 0.15, 0.05]))


@pytest.mark.parametrize("kwargs,kept", [
    (dict(top_k=2), [1, 3]),
    (dict(top_k=1), [1]),
    (dict(top_p=0.8), [1, 3]),  # 0.5 + 0.3 reaches 0.8
    (dict(top_p=0.81), [1, 3, 2]),
    (dict(min_p=0.2), [1, 3, 2]),  # 0.15 >= 0.2 * 0.5; 0.05 is not
    (dict(min_p=0.7), [1]),
    (dict(top_k=3, min_p=0.4), [1, 3]),  # after top-k renormalises: 0.3/0.95 >= 0.4 * 0.5/0.95
    (dict(temperature=0), [1]),  # greedy
    (dict(temperature=0.5, top_p=0.8), [1, 3]),  # T=0.5 sharpens: 0.5^2 : 0.3^2 ... top-1 alone is < 0.8
])
def test_filters_keep_exactly_the_expected_tokens_and_sum_to_one(kwargs, kept):
    ids, probs = vs.filtered_distribution(LOGITS, **kwargs)
    assert ids.tolist() == kept
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert (probs[:-1] >= probs[1:]).all()  # most likely first


def test_kept_probabilities_are_renormalised():
    ids, probs = vs.filtered_distribution(LOGITS, top_k=2)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3]) / 0.8)


def test_temperature_matches_the_formula():
    ids, probs = vs.filtered_distribution(LOGITS, temperature=2.0)
    expected = (LOGITS / 2.0).softmax(-1)
    torch.testing.assert_close(probs, expected[ids])


def test_repetition_penalty_lowers_seen_tokens():
    logits = torch.tensor([2.0, 1.0, -1.0, 0.5])
    base = dict(zip(*[t.tolist() for t in vs.filtered_distribution(logits)]))
    pen = dict(zip(*[t.tolist() for t in vs.filtered_distribution(logits, repetition_penalty=2.0, seen=[0, 2, 0])]))
    assert pen[0] < base[0] and pen[2] < base[2]  # seen: 2.0 -> 1.0, -1.0 -> -2.0
    assert pen[1] > base[1] and pen[3] > base[3]
    expected = torch.tensor([1.0, 1.0, -2.0, 0.5]).softmax(-1)
    assert [pen[i] for i in range(4)] == pytest.approx(expected.tolist(), abs=1e-6)


def test_bad_values_raise_like_sampling_params():
    with pytest.raises(ValueError, match="top_p"):
        vs.filtered_distribution(LOGITS, top_p=0.0)


def test_next_token_logits_is_the_last_position_of_a_full_forward(tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2)
    model = Transformer(cfg).eval()
    prompt = "Once upon a time"
    logits = vs.next_token_logits(model, tokenizer, prompt)
    with torch.no_grad():
        full = model(torch.tensor([tokenizer.encode(prompt)]))  # [1, seq, vocab]
    assert logits.shape == (cfg.vocab_size,) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, full[0, -1])
    torch.testing.assert_close(vs.next_token_logits(model, tokenizer, tokenizer.encode(prompt)), logits)


def test_token_labels_are_ascii(tokenizer):
    paris = tokenizer.encode(" Paris")
    assert len(paris) == 1 and vs.token_label(tokenizer, paris[0]) == "' Paris'"
    assert vs.token_label(tokenizer, tokenizer.encode("在")[0]) == "'\\u5728'"
    partial = tokenizer.encode("北")[0]  # the first two bytes of 北 only
    assert tokenizer.token_bytes(partial) == "北".encode()[:2]
    assert vs.token_label(tokenizer, partial) == repr("北".encode()[:2])
    assert vs.token_label(tokenizer, tokenizer.encode("\n")[0]) == "'\\n'"


def test_top_tokens_rows(tokenizer):
    ids = torch.tensor(tokenizer.encode(" Paris London"))
    rows = vs.top_tokens(tokenizer, ids, torch.tensor([0.7, 0.2]), n=5)
    assert rows == [(ids[0].item(), " Paris", 0.7), (ids[1].item(), " London", 0.2)]


def test_plot_filter_draws_before_after_and_marks_removed(tokenizer):
    logits = torch.linspace(5, -5, tokenizer.vocab_size)  # token 0 most likely, then 1, 2, ...
    fig = vs.plot_filter(logits, tokenizer, top_k=3, n=10)
    ax = fig.axes[0]
    before, after = ax.containers  # two bar groups of 10
    assert len(before) == len(after) == 10
    heights = [b.get_height() for b in after]
    assert all(h > 0 for h in heights[:3]) and all(h == 0 for h in heights[3:])
    assert sum(heights) == pytest.approx(100, abs=1e-3)  # the 3 kept tokens carry all the mass, in %
    assert len(ax.collections[0].get_offsets()) == 7  # an x under each removed token
    assert ax.get_ylabel() == "probability (%)" and "top_k=3" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()][0] == vs.token_label(tokenizer, 0)


def test_plot_temperatures_and_per_layer(tokenizer):
    logits = torch.linspace(3, -3, tokenizer.vocab_size)
    ax = vs.plot_temperatures(logits, tokenizer, (0.5, 1.0, 2.0), n=8).axes[0]
    lines = ax.get_lines()
    assert len(lines) == 3
    first = [ln.get_ydata()[0] for ln in lines]  # the top token: sharper at low T
    assert first[0] > first[1] > first[2]
    ax = vs.plot_per_layer([1.0, 2.0, 3.0], "RMS", "t").axes[0]
    assert list(ax.get_lines()[0].get_ydata()) == [1.0, 2.0, 3.0]


def test_sample_counts_follow_the_probabilities_and_the_seed(tokenizer):
    probs = torch.tensor([0.6, 0.3, 0.1])
    counts = vs.sample_counts(probs, 20000, seed=1)
    assert counts.sum() == 20000
    torch.testing.assert_close(counts.float() / 20000, probs, atol=0.02, rtol=0)
    assert torch.equal(counts, vs.sample_counts(probs, 20000, seed=1))  # same seed, same draws
    fig = vs.plot_sample_counts(torch.tensor([5, 6, 7]), probs, counts, tokenizer)
    assert len(fig.axes[0].containers) == 2


def test_widget_callback_draws(tokenizer):
    pytest.importorskip("ipywidgets")
    logits = torch.linspace(5, -5, tokenizer.vocab_size)
    widget = vs.sampling_widget(logits, tokenizer, n=5)
    names = [c.description for c in widget.children[:4]]
    assert names[0] == "temperature" and names[2] == "top_p"
    plt.close("all")
    widget.children[1].value = 2  # the top_k slider: the callback redraws
    title = plt.gcf().axes[0].get_title()  # (under Agg, show() leaves the figure open)
    assert "top_k=2" in title and "2 of" in title


def test_compare_filtered_counts_kept_sets_and_the_largest_difference():
    inf = float("-inf")
    a = torch.tensor([1.0, 2.0, inf, 0.5, inf])
    b = torch.tensor([1.0, 2.5, 3.0, inf, inf])
    c = vs.compare_filtered(a, b)
    assert (c.both, c.only_first, c.only_second) == (2, 1, 1) and not c.same_tokens
    assert c.max_abs_diff == pytest.approx(0.5)
    assert str(c) == "2 tokens kept by both, 2 by only one, max |difference| 5.0e-01"
    same = vs.compare_filtered(a, a.clone())
    assert same.same_tokens and same.max_abs_diff == 0.0 and same.both == 3


def test_plot_nucleus_marks_where_each_curve_reaches_p():
    peaked = torch.tensor([5.0, 1.0, 0.0, -1.0, -2.0] + [-5.0] * 95)
    flat = torch.zeros(100)
    ax = vs.plot_nucleus({"peaked": peaked, "flat": flat}, 0.855).axes[0]
    lines = ax.get_lines()
    assert len(lines) == 3  # two curves and the dashed top_p line
    assert lines[1].get_ydata()[-1] == pytest.approx(1.0)  # a cumulative sum ends at 1
    kept = [int(c.get_offsets()[0][0]) for c in ax.collections]
    assert kept == [1, 86]  # the peaked top token alone holds 0.97; 86 of 100 equal tokens pass 0.855
    assert "keeps 86" in ax.get_legend().get_texts()[1].get_text()
    assert ax.get_xscale() == "log" and "cumulative" in ax.get_ylabel()


def test_plot_parameter_shares_splits_one_bar_by_share():
    parts = {"self_attn.q_proj.weight": 100, "self_attn.k_proj.weight": 50, "mlp.gate_proj.weight": 300,
             "mlp.up_proj.weight": 300, "mlp.down_proj": 250}  # shortened to the *_proj part
    ax = vs.plot_parameter_shares(parts, "a block").axes[0]
    bars = ax.patches
    assert [round(b.get_width(), 3) for b in bars] == [10.0, 5.0, 30.0, 30.0, 25.0]
    assert bars[-1].get_x() + bars[-1].get_width() == pytest.approx(100)
    assert "1,000" in ax.get_xlabel() and ax.get_title() == "a block"
    texts = [t.get_text() for t in ax.texts]
    assert "gate_proj\n30%" in texts and "k_proj\n5%" in texts
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == "q_proj (10.0%)"
    assert bars[0].get_facecolor() != bars[2].get_facecolor()  # attention blue, MLP orange
