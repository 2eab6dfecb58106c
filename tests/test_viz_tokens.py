"""The chapter 1 figures and the token widget's plain callbacks."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.bpe import BPE, bpe_training_steps, train_bpe, vocab_from_merges  # noqa: E402
from course_lib.viz import tokens as viz  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def toy():
    """A tiny BPE trained on a toy text: quick, and it has the same interface as the real tokenizer."""
    text = "the cat sat on the mat, the cat ate."
    merges = train_bpe(text, 20)
    vocab = vocab_from_merges(merges)
    vocab["<|end|>"] = len(vocab)
    return BPE(vocab, merges, special_tokens=["<|end|>"])


def test_spans_tile_the_bytes_of_the_text(toy):
    text = "the cat 猫<|end|>"
    spans = viz.token_spans(toy, text)
    assert [s.id for s in spans] == toy.encode(text)
    assert b"".join(s.raw for s in spans) == text.encode()
    assert spans[0].start == 0 and spans[-1].end == len(text.encode())
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))
    assert [s.index for s in spans] == list(range(len(spans)))
    assert spans[-1].special and spans[-1].text == "<|end|>"


def test_partial_characters_show_their_bytes(toy):
    spans = viz.token_spans(toy, "猫")  # no merges for it in the toy vocabulary: 3 byte tokens
    assert [s.raw for s in spans] == [b"\xe7", b"\x8c", b"\xab"]
    assert not any(s.complete for s in spans)
    assert [s.text for s in spans] == ["<e7>", "<8c>", "<ab>"]


def test_spans_with_the_real_tokenizer(tokenizer):
    text = "Hi 你好🚀\n<|im_end|>"
    spans = viz.token_spans(tokenizer, text)
    assert b"".join(s.raw for s in spans) == text.encode()
    assert spans[-1].special and spans[-1].id == 2
    assert spans[0].text == "Hi" and spans[0].complete


def test_render_html_shows_every_token_and_id(toy):
    text = "the cat\n<&>"
    spans = viz.token_spans(toy, text)
    page = viz.render_tokens_html(spans)
    assert page.count('title="id ') == len(spans)
    for s in spans:
        assert f">{s.id}</span>" in page
    assert "&lt;&amp;&gt;" in page or "&lt;" in page  # text is escaped, never raw HTML
    assert "<&>" not in page
    assert "␣cat" in page and "↵" in page and "<br>" in page  # spaces and newlines made visible
    assert f"<b>{len(spans)} tokens</b>" in page
    assert f">{spans[0].id}</span>" not in viz.render_tokens_html(spans, show_ids=False)


def test_render_html_marks_partial_characters(toy):
    page = viz.render_tokens_html(viz.token_spans(toy, "猫"))
    assert page.count("dashed") == 3 and "&lt;e7&gt;" in page
    assert "1 characters, 3 UTF-8 bytes" in page


def test_render_html_truncates_long_texts(toy):
    spans = viz.token_spans(toy, "the cat " * 50)
    page = viz.render_tokens_html(spans, max_tokens=10)
    assert page.count('title="id ') == 10 and f"({len(spans) - 10} more tokens)" in page


def test_token_costs_and_plot(toy):
    costs = viz.token_costs(toy, {"English": "the cat", "Chinese": "猫"})
    assert [(c.chars, c.bytes, c.tokens) for c in costs] == [(7, 7, len(toy.encode("the cat"))), (1, 3, 3)]
    assert costs[1].tokens_per_char == 3.0 and costs[1].bytes_per_token == 1.0
    fig = viz.plot_token_costs(costs)
    left, right = fig.axes
    assert [p.get_width() for p in left.patches] == [c.tokens for c in costs]
    assert [t.get_text() for t in left.get_yticklabels()] == ["English", "Chinese"]
    assert "tokens" in left.get_xlabel() and "per character" in right.get_xlabel()
    assert left.get_title() and right.get_title() and fig.get_suptitle()
    fig = viz.plot_token_costs(costs, highlight=["Chinese"])
    first, second = fig.axes[0].patches
    assert first.get_facecolor() != second.get_facecolor()


@pytest.mark.parametrize("text, script", [("Ġthe".replace("Ġ", " "), "Latin"), ("数据", "Han (Chinese)"),
                                           ("  ", "space"), ("42", "digits"), ("!=", "punctuation/symbols"),
                                           ("Привет", "Cyrillic"), ("の", "Hiragana")])
def test_script_of(text, script):
    assert viz.script_of(text) == script


def test_vocab_scripts_counts_every_entry(toy):
    counts = viz.vocab_scripts(toy, vocab_size=len(toy.vocab))
    assert sum(counts.values()) == len(toy.vocab) - 1  # the special token is left out
    assert counts["partial character"] == 128  # bytes 0x80-0xff are never whole characters alone
    fig = viz.plot_vocab_scripts(counts)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "count" in ax.get_xlabel() and ax.get_title()
    assert [p.get_width() for p in ax.patches] == list(counts.values())


def test_training_curve():
    text = "low low low lower lower newest newest widest"
    steps = list(bpe_training_steps(text, 8))
    fig = viz.plot_training_curve(steps, initial_tokens=len(text.encode()))
    ax = fig.axes[0]
    x, y = ax.lines[0].get_data()
    assert list(x) == list(range(len(steps) + 1))
    assert y[0] == len(text.encode()) and list(y[1:]) == [s.num_tokens for s in steps]
    assert all(b < a for a, b in zip(y, y[1:]))
    assert "merges" in ax.get_xlabel() and "tokens" in ax.get_ylabel()


def test_readable_bytes_and_describe_merge():
    assert viz.readable_bytes("猫".encode()) == "猫"
    assert viz.readable_bytes(b"\xe7\x8c") == "<e7 8c>"
    steps = list(bpe_training_steps("aaabdaaabac", 2))
    assert viz.describe_merge(steps[0]) == "merge   0:        'a' + 'a'        -> 'aa'           seen   4 times; text now 9 tokens"
    line = viz.describe_merge(next(bpe_training_steps("猫猫", 1)))
    assert "'<e7>' + '<8c>'" in line and "'<e7 8c>'" in line


def test_widget_updates_on_typing(toy):
    w = viz.token_widget(toy, "the cat")
    box, shown = w.children
    assert shown.value == viz.render_tokens_html(viz.token_spans(toy, "the cat"))
    box.value = "猫"
    assert "&lt;e7&gt;" in shown.value
