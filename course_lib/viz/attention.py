"""Figures and the widget of chapter 3, attention (注意力): heatmaps of attention weights, KV memory bars,
the head sharing of MHA / GQA / MQA, and the memory of the score matrix against sequence length.

Plain functions return matplotlib `Figure`s; `attention_widget` is thin ipywidgets glue over them.
`weights` everywhere is what `ReferenceAttention.weights` holds (a dict layer -> [batch, heads, seq, seq])
or what transformers returns with `output_attentions=True` (a tuple of the same tensors).
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Mapping, Sequence

import torch

from .positions import _as_numpy, _new_axes, matrix_heatmap

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..tokenizer import Tokenizer

MiB = 1024 ** 2


@lru_cache(maxsize=1)
def _font_codepoints() -> frozenset[int]:
    """Code points the default matplotlib font can draw."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font

    font = FT2Font(findfont(FontProperties(family=rcParams["font.family"])))
    return frozenset(font.get_charmap())


def token_labels(tokens: Sequence[str]) -> list[str]:
    """Tick labels for tokens: a space shows as '␣', a newline as '↵', and a character the plot font
    lacks (e.g. Chinese without a CJK font) as its code point 'U+4E2D', so matplotlib draws every label."""
    known = _font_codepoints()
    out = []
    for t in tokens:
        t = t.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
        out.append("".join(c if ord(c) in known else f"U+{ord(c):04X}" for c in t))
    return out


def token_strings(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each id as text; a token that is only part of a UTF-8 character shows its bytes, e.g. '<e4 b8>'."""
    out = []
    for i in ids:
        raw = tokenizer.token_bytes(int(i))
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append("<" + " ".join(f"{b:02x}" for b in raw) + ">")
    return out


def _head_matrix(weights, layer: int, head: int, batch: int = 0) -> torch.Tensor:
    w = weights[layer]
    if w.dim() != 4:
        raise ValueError(f"weights[{layer}] must be [batch, heads, seq, seq], got shape {tuple(w.shape)}")
    if not 0 <= head < w.shape[1]:
        raise ValueError(f"head {head} out of range: layer {layer} has {w.shape[1]} heads")
    return w[batch, head]  # [seq, seq]


def attention_heatmap(weights, tokens: Sequence[str], layer: int, head: int, batch: int = 0,
                      ax: Axes | None = None) -> Figure:
    """Heatmap of one head's attention weights: row = the query token, column = the key token it looks at.

    Each row sums to 1; the upper triangle is 0 (the causal mask, 因果掩码).
    """
    w = _head_matrix(weights, layer, head, batch)
    if len(tokens) != w.shape[-1]:
        raise ValueError(f"{len(tokens)} tokens for a {w.shape[-1]}-token attention matrix")
    labels = token_labels(tokens)
    return matrix_heatmap(w, labels, labels, title=f"Attention weights, layer {layer}, head {head}",
                          xlabel="key token (looked at)", ylabel="query token (looking)",
                          cbar_label="attention weight (each row sums to 1)", ax=ax, vmin=0.0)


def attention_heads_grid(weights, tokens: Sequence[str], layer: int, batch: int = 0, cols: int = 3) -> Figure:
    """All heads of one layer side by side (small multiples, shared 0..1 colour scale)."""
    import matplotlib.pyplot as plt

    num_heads = weights[layer].shape[1]
    rows = -(-num_heads // cols)
    labels = token_labels(tokens)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), layout="constrained", squeeze=False)
    im = None
    for h, ax in enumerate(axes.flat):
        if h >= num_heads:
            ax.axis("off")
            continue
        im = ax.imshow(_as_numpy(_head_matrix(weights, layer, h, batch)), vmin=0, vmax=1, cmap="viridis",
                       interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
    fig.supxlabel("key token (looked at)")
    fig.supylabel("query token (looking)")
    fig.suptitle(f"Attention weights of every head, layer {layer}")
    fig.colorbar(im, ax=axes, label="attention weight", shrink=0.6)
    return fig


def kv_memory_plot(kv_bytes: Mapping[str, int], title: str = "KV cache per token") -> Figure:
    """Horizontal bars of KV-cache bytes (shown in KiB), one bar a configuration, value written on each bar."""
    fig, ax = _new_axes(None, figsize=(7, 0.55 * len(kv_bytes) + 1.6))
    names = list(kv_bytes)
    kib = [kv_bytes[n] / 1024 for n in names]
    bars = ax.barh(names, kib, color="tab:blue")
    for bar, v in zip(bars, kib):
        ax.annotate(f"{v:,.1f} KiB" if v < 100 else f"{v:,.0f} KiB", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    textcoords="offset points", xytext=(3, 0), va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(kib) * 1.25)
    ax.set_xlabel("KV cache per token (KiB)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def gqa_sharing_diagram(num_heads: int, kv_head_counts: Sequence[int], head_dim: int | None = None,
                        num_layers: int | None = None, dtype: torch.dtype | None = None) -> Figure:
    """One panel per KV-head count: query heads on top, the KV heads they read below, a line from each query head h
    to KV head h // (num_heads // kv_heads), coloured by group (分组查询注意力).

    With `head_dim`, `num_layers` and `dtype`, each panel also states the KV-cache bytes per token
    (2 x layers x KV heads x head_dim x bytes). Artists carry ids: boxes "q3", "kv1", lines "q3->kv1".
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    for kv in kv_head_counts:
        if kv < 1 or num_heads % kv:
            raise ValueError(f"{num_heads} query heads cannot be shared evenly by {kv} KV heads")
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(1, len(kv_head_counts), figsize=(4.2 * len(kv_head_counts), 3.1), squeeze=False,
                             layout="constrained")
    for ax, kv in zip(axes[0], kv_head_counts):
        group = num_heads // kv
        width = num_heads  # both rows span the same width: KV boxes sit under their group of query heads
        q_x = [(h + 0.5) * width / num_heads for h in range(num_heads)]
        kv_x = [(g + 0.5) * width / kv for g in range(kv)]
        for h, x in enumerate(q_x):
            g = h // group
            ax.add_patch(FancyBboxPatch((x - 0.35, 1.6), 0.7, 0.5, boxstyle="round,pad=0.02", fc=colors[g % 10],
                                        ec="black", lw=0.6, alpha=0.85, gid=f"q{h}"))
            ax.text(x, 1.85, f"Q{h}", ha="center", va="center", fontsize=7)
            ax.plot([x, kv_x[g]], [1.6, 0.75], color=colors[g % 10], lw=1.2, gid=f"q{h}->kv{g}")
        for g, x in enumerate(kv_x):
            w = min(0.9 * width / kv, width - 0.2)
            ax.add_patch(FancyBboxPatch((x - w / 2, 0.25), w, 0.5, boxstyle="round,pad=0.02", fc=colors[g % 10],
                                        ec="black", lw=1.0, gid=f"kv{g}"))
            ax.text(x, 0.5, f"K{g}, V{g}" if w > 1.2 else f"KV{g}", ha="center", va="center", fontsize=7)
        kind = "MHA" if kv == num_heads else "MQA" if kv == 1 else f"GQA, groups of {group}"
        ax.set_title(f"{kind}: {num_heads} query / {kv} KV heads", fontsize=10)
        if head_dim and num_layers and dtype is not None:
            per_token = 2 * num_layers * kv * head_dim * torch.empty((), dtype=dtype).element_size()
            ax.text(width / 2, -0.05, f"KV cache: {per_token:,} bytes/token in {str(dtype).removeprefix('torch.')}",
                    ha="center", va="top", fontsize=8)
        ax.text(-0.3, 1.85, "query\nheads", ha="right", va="center", fontsize=7)
        ax.text(-0.3, 0.5, "cached\nK, V heads", ha="right", va="center", fontsize=7)
        ax.set_xlim(-1.6, width + 0.1)
        ax.set_ylim(-0.45, 2.25)
        ax.axis("off")
    fig.suptitle("Which key/value head each query head reads", fontsize=11)
    return fig


def memory_vs_length_plot(seq_lens: Sequence[int], formulas: Mapping[str, Sequence[float]],
                          measured: Mapping[str, Sequence[float]] | None = None,
                          measured_lens: Sequence[int] | None = None, on_chip_bytes: Mapping[str, float] | None = None,
                          title: str = "Attention memory against sequence length") -> Figure:
    """Log-log lines of bytes against sequence length (`formulas`, one value per length), markers for measured peaks
    (`measured`, one value per `measured_lens`; a name that is also a formula's gets that line's colour), and dashed
    horizontal lines for on-chip memory sizes."""
    fig, ax = _new_axes(None, figsize=(7.5, 4.6))
    colors = {}
    for name, values in formulas.items():
        if len(values) != len(seq_lens):
            raise ValueError(f"{name!r}: {len(values)} values for {len(seq_lens)} lengths")
        (line,) = ax.plot(seq_lens, [v / MiB for v in values], marker=".", label=name)
        colors[name] = line.get_color()
    for name, values in (measured or {}).items():
        if measured_lens is None or len(values) != len(measured_lens):
            raise ValueError(f"measured {name!r} needs one value per measured_lens")
        ax.plot(measured_lens, [v / MiB for v in values], ls="none", marker="o", mfc="none", ms=9, mew=1.6,
                color=colors.get(name), label=f"{name}: measured peak")
    for name, size in (on_chip_bytes or {}).items():
        ax.axhline(size / MiB, color="gray", ls="--", lw=1)
        ax.annotate(name, (seq_lens[0], size / MiB), textcoords="offset points", xytext=(2, 3), fontsize=8,
                    color="dimgray")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(seq_lens) | set(measured_lens or []))
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("bytes (MiB, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def attention_for_prompt(model, tokenizer: Tokenizer, prompt: str) -> tuple[dict[int, torch.Tensor], list[str]]:
    """Run `model` on `prompt` with `ReferenceAttention`; return (weights per layer, token strings)."""
    from ..attention import ReferenceAttention

    ids = tokenizer.encode(prompt)
    ref = ReferenceAttention()
    with torch.no_grad():
        model(torch.tensor([ids], device=model.device), kv=ref)
    return ref.weights, token_strings(tokenizer, ids)


def attention_widget(model, tokenizer: Tokenizer, prompt: str):
    """Prompt box + layer and head sliders -> `attention_heatmap`. Recomputes the weights when the prompt changes."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    state = {}
    text = widgets.Text(value=prompt, description="prompt", continuous_update=False,
                        layout=widgets.Layout(width="90%"))
    layer = widgets.IntSlider(value=0, min=0, max=model.config.num_layers - 1, description="layer")
    head = widgets.IntSlider(value=0, min=0, max=model.config.num_heads - 1, description="head")
    out = widgets.Output()

    def recompute(*_):
        state["weights"], state["tokens"] = attention_for_prompt(model, tokenizer, text.value)
        redraw()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            fig = attention_heatmap(state["weights"], state["tokens"], layer.value, head.value)
            display(fig)
            plt.close(fig)

    text.observe(recompute, "value")
    layer.observe(redraw, "value")
    head.observe(redraw, "value")
    recompute()
    return widgets.VBox([text, widgets.HBox([layer, head]), out])
