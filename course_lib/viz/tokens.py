"""Figures and the widget of chapter 1, tokenization (分词): coloured tokens, token costs, BPE training.

Plain functions return data, HTML strings or matplotlib `Figure`s; `token_widget` is thin
ipywidgets glue over `token_spans` and `render_tokens_html`. A "tokenizer" here is anything with
`encode(text)`, `token_bytes(id)` and `special_ids`: `course_lib.load_tokenizer()` or `course_lib.bpe.BPE`.
"""
from __future__ import annotations

import html
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..bpe import MergeStep

# Pastel backgrounds, cycled so that neighbouring tokens always differ.
PALETTE = ("#ffd6a5", "#caffbf", "#9bf6ff", "#bdb2ff", "#ffc6ff", "#fdffb6", "#a0c4ff", "#ffadad")


@dataclass
class TokenSpan:
    """One token of a text: its id, the bytes it stands for, and where those bytes sit in the text."""

    index: int  # position in the token sequence
    id: int
    raw: bytes  # the UTF-8 bytes of this token (may be part of one character)
    start: int  # byte offsets [start, end) in the encoded text
    end: int
    special: bool

    @property
    def complete(self) -> bool:
        """True when the bytes decode as UTF-8 on their own (not a piece of a character)."""
        try:
            self.raw.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False

    @property
    def text(self) -> str:
        """Readable form: the decoded text, or the bytes in hex, e.g. '<e4 bd>', for a partial character."""
        return readable_bytes(self.raw)


def readable_bytes(raw: bytes) -> str:
    """Bytes as text when they are valid UTF-8, else in hex: b'\\xe4\\xbd' -> '<e4 bd>'."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "<" + " ".join(f"{b:02x}" for b in raw) + ">"


def token_spans(tokenizer, text: str, ids: Sequence[int] | None = None) -> list[TokenSpan]:
    """Encode `text` (unless `ids` are given) and describe each token as a `TokenSpan`."""
    ids = tokenizer.encode(text) if ids is None else ids
    special = getattr(tokenizer, "special_ids", set())
    spans, offset = [], 0
    for index, token_id in enumerate(ids):
        raw = tokenizer.token_bytes(int(token_id))
        spans.append(TokenSpan(index, int(token_id), raw, offset, offset + len(raw), int(token_id) in special))
        offset += len(raw)
    return spans


def _visible(text: str) -> str:
    """Make spaces and line breaks visible: ' ' -> '␣', newline -> '↵', tab -> '⇥'."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\r", "␍").replace("\t", "⇥")


def render_tokens_html(spans: Sequence[TokenSpan], show_ids: bool = True, max_tokens: int = 2000) -> str:
    """HTML that shows each token on its own colour, with its id underneath.

    A token that is only part of a UTF-8 character shows its bytes in hex with a dashed border;
    a special token is bold. A header line counts characters, bytes and tokens.
    """
    num_bytes = sum(len(s.raw) for s in spans)
    num_chars = len(b"".join(s.raw for s in spans).decode("utf-8", errors="replace"))
    parts = [f'<div style="font-family: monospace; font-size: 14px; line-height: 1.3">'
             f'<div style="margin-bottom: 4px; color: #444">{num_chars} characters, {num_bytes} UTF-8 bytes, '
             f'<b>{len(spans)} tokens</b></div>']
    for s in spans[:max_tokens]:
        border = "1px solid #888" if s.complete else "1px dashed #c00"
        title = f"id {s.id} | bytes {s.raw.hex(' ')}" + (" | special token" if s.special else "")
        label = html.escape(_visible(s.text))
        if s.special:
            label = f"<b>{label}</b>"
        ident = f'<br><span style="font-size: 10px; color: #555">{s.id}</span>' if show_ids else ""
        parts.append(f'<span title="{html.escape(title)}" style="display: inline-block; text-align: center; '
                     f'vertical-align: top; background: {PALETTE[s.index % len(PALETTE)]}; border: {border}; '
                     f'border-radius: 3px; padding: 1px 3px; margin: 2px 1px; white-space: pre">{label}{ident}</span>')
        if s.raw.endswith(b"\n"):
            parts.append("<br>")
    if len(spans) > max_tokens:
        parts.append(f"<span> ... ({len(spans) - max_tokens} more tokens)</span>")
    parts.append("</div>")
    return "".join(parts)


# ----------------------------------------------------------------------------- token costs

@dataclass
class TokenCost:
    """What one text costs in characters, UTF-8 bytes and tokens."""

    name: str
    chars: int
    bytes: int
    tokens: int

    @property
    def tokens_per_char(self) -> float:
        return self.tokens / self.chars

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens


def token_costs(tokenizer, texts: Mapping[str, str]) -> list[TokenCost]:
    """Characters, bytes and tokens of each named text."""
    return [TokenCost(name, len(t), len(t.encode("utf-8")), len(tokenizer.encode(t))) for name, t in texts.items()]


def plot_token_costs(costs: Sequence[TokenCost], title: str = "The same sentence in several languages",
                     highlight: Sequence[str] = ()) -> Figure:
    """Two panels: tokens needed for each text, and tokens per character; `highlight` names bars drawn darker."""
    import matplotlib.pyplot as plt

    names = [c.name for c in costs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    colours = ["#1f3b66" if n in highlight else "#4c72b0" for n in names]
    bars = left.barh(names, [c.tokens for c in costs], color=colours)
    left.bar_label(bars, padding=2, fontsize=8)
    left.set(xlabel="tokens (count)", title="Tokens for the whole text")
    colours = ["#8c3d0f" if n in highlight else "#dd8452" for n in names]
    bars = right.barh(names, [c.tokens_per_char for c in costs], color=colours)
    right.bar_label(bars, labels=[f"{c.tokens_per_char:.2f}" for c in costs], padding=2, fontsize=8)
    right.set(xlabel="tokens per character", title="Tokens per character")
    for ax in (left, right):
        ax.invert_yaxis()
        ax.margins(x=0.15)
    fig.suptitle(title)
    return fig


def script_of(text: str) -> str:
    """The writing system of a token's text: 'Han (Chinese)', 'Latin', 'Cyrillic', ..., 'digits', 'space',
    'punctuation/symbols', or 'partial character' when it is not valid UTF-8 on its own."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        if text and all(c.isdigit() for c in text):
            return "digits"
        if text and text.isspace():
            return "space"
        return "punctuation/symbols"
    name = unicodedata.name(letters[0], "")
    if name.startswith("CJK"):
        return "Han (Chinese)"
    for script in ("LATIN", "CYRILLIC", "GREEK", "ARABIC", "HEBREW", "DEVANAGARI", "HIRAGANA", "KATAKANA", "HANGUL"):
        if name.startswith(script):
            return script.capitalize()
    return "other letters"


def vocab_scripts(tokenizer, vocab_size: int | None = None) -> dict[str, int]:
    """How many vocabulary entries belong to each writing system (special tokens left out)."""
    size = vocab_size or tokenizer.vocab_size
    counts: dict[str, int] = {}
    special = getattr(tokenizer, "special_ids", set())
    for i in range(size):
        if i in special:
            continue
        raw = tokenizer.token_bytes(i)
        try:
            key = script_of(raw.decode("utf-8"))
        except UnicodeDecodeError:
            key = "partial character"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def plot_vocab_scripts(counts: Mapping[str, int], title: str = "What the vocabulary is made of") -> Figure:
    """Horizontal bars of vocabulary entries per writing system, on a log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    bars = ax.barh(list(counts), list(counts.values()), color="#55a868")
    ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.margins(x=0.2)
    ax.set(xlabel="vocabulary entries (count, log scale)", title=title)
    return fig


# ----------------------------------------------------------------------------- BPE training

def describe_merge(step: MergeStep) -> str:
    """One line per learned merge: rank, the two tokens, the new token, its count and the text length after it."""
    from ..bpe import symbols_to_bytes

    a, b = (repr(readable_bytes(symbols_to_bytes(t))) for t in step.pair)
    new = repr(readable_bytes(symbols_to_bytes(step.new_token)))
    return f"merge {step.rank:3d}: {a:>10} + {b:<10} -> {new:<14} seen {step.count:3d} times; text now {step.num_tokens} tokens"


def plot_training_curve(steps: Sequence[MergeStep], initial_tokens: int, ax: Axes | None = None) -> Figure:
    """Length of the training text in tokens as merges are learned (each merge shortens it by its count,
    or less when the pair overlaps itself: "aaa" holds the pair a+a twice but merges once)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    else:
        fig = ax.figure
    ax.plot([0] + [s.rank + 1 for s in steps], [initial_tokens] + [s.num_tokens for s in steps], marker=".")
    ax.set(xlabel="merges learned (count)", ylabel="training text length (tokens)",
           title="Each merge makes the text shorter")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return fig


# ----------------------------------------------------------------------------- widget

def token_widget(tokenizer, text: str = "Hello! 你好，世界 🚀"):
    """Type text, see its coloured tokens and ids (ipywidgets glue over `token_spans` and `render_tokens_html`)."""
    import ipywidgets as widgets

    box = widgets.Textarea(value=text, description="text", layout=widgets.Layout(width="95%", height="80px"))
    shown = widgets.HTML()

    def update(*_):
        shown.value = render_tokens_html(token_spans(tokenizer, box.value))

    box.observe(update, names="value")
    update()
    return widgets.VBox([box, shown])
