""""You are here": the path from text to text, drawn with this chapter's step highlighted.

    from course_lib.viz.pipeline import show_pipeline
    show_pipeline("kv cache", chapter="06 · The KV cache")
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

# The stages, left to right, each with the chapter that teaches it.
STAGES: list[tuple[str, str]] = [
    ("text", "00"),
    ("tokenizer", "01"),
    ("embeddings\n+ RoPE", "02"),
    ("attention", "03"),
    ("prefill /\ndecode", "05"),
    ("KV cache", "06"),
    ("logits", "04"),
    ("sampler", "04"),
    ("detokenizer", "01"),
    ("text", "00"),
]
# What runs around the path: the engine's parts that are not one stage.
BANDS: list[tuple[str, tuple[int, int], str]] = [
    ("weights (quantization 08)", (2, 6), "quantization"),
    ("engine: batching and scheduling (07)", (1, 8), "scheduler"),
]


def _key(name: str) -> str:
    return " ".join(name.lower().replace("/", " ").split())


def show_pipeline(highlight: str | Sequence[str], chapter: str | None = None) -> Figure:
    """Draw the pipeline; stages or bands whose name contains a `highlight` word are coloured.

    highlight: e.g. "prefill", "kv cache", "scheduler", "quantization", or "all" (profiling: the whole path).
    """
    words = [highlight] if isinstance(highlight, str) else list(highlight)
    words = [_key(w) for w in words]
    hit = lambda name: "all" in words or any(w in _key(name) for w in words)  # noqa: E731
    known = [_key(n) for n, _ in STAGES] + [_key(k) for *_, k in BANDS] + [_key(b) for b, *_ in BANDS]
    unknown = [w for w in words if w != "all" and not any(w in k for k in known)]
    if unknown:
        raise ValueError(f"no pipeline stage matches {unknown}; stages: {[n.replace(chr(10), ' ') for n, _ in STAGES]}")

    fig, ax = plt.subplots(figsize=(13, 2.6))
    w, gap = 1.0, 0.32
    for i, (name, ch) in enumerate(STAGES):
        x = i * (w + gap)
        on = hit(name)
        ax.add_patch(FancyBboxPatch((x, 0.9), w, 0.8, boxstyle="round,pad=0.04,rounding_size=0.12",
                                    fc="#f4a259" if on else "#eef1f5", ec="#c2571a" if on else "#9aa5b1",
                                    lw=2 if on else 1))
        ax.text(x + w / 2, 1.3, name, ha="center", va="center", fontsize=9, weight="bold" if on else "normal")
        ax.text(x + w / 2, 0.78, f"ch {ch}", ha="center", va="top", fontsize=7, color="#52606d")
        if i:
            ax.annotate("", (x - 0.02, 1.3), (x - gap + 0.02, 1.3), arrowprops=dict(arrowstyle="->", color="#52606d"))
    for row, (label, (first, last), key) in enumerate(BANDS):
        x0, x1 = first * (w + gap), last * (w + gap) + w
        y = 0.28 - row * 0.34
        on = hit(label) or hit(key)
        ax.add_patch(FancyBboxPatch((x0, y), x1 - x0, 0.24, boxstyle="round,pad=0.02,rounding_size=0.08",
                                    fc="#f4a259" if on else "#f7f8fa", ec="#c2571a" if on else "#cbd2d9"))
        ax.text((x0 + x1) / 2, y + 0.12, label, ha="center", va="center", fontsize=8,
                weight="bold" if on else "normal")
    ax.set_xlim(-0.2, len(STAGES) * (w + gap))
    ax.set_ylim(-0.2, 1.9)
    ax.axis("off")
    ax.set_title(f"You are here: {chapter}" if chapter else "From text to text", loc="left", fontsize=11)
    fig.tight_layout()
    return fig


def draw_request_loop() -> Figure:
    """One request from text to text, with the decode loop: the README's picture (`benchmarks.thumbnails`).

    text → tokenizer → prefill (fills the KV cache) → sampler → detokenizer → streamed text; the sampled token
    goes back into a decode step (one token in, the cache grows by one) until EOS, a stop string or max_tokens.
    """
    fig, ax = plt.subplots(figsize=(11, 5.0))
    bw, bh = 2.15, 1.3
    col = [1.15, 3.85, 6.55, 9.25, 11.95, 14.65]
    top, low = 4.0, 1.25
    boxes = {  # name -> (x centre, y centre, title, detail, chapter, colour)
        "text": (col[0], top, "text", "“What is a\nKV cache?”", "00", "#eef1f5"),
        "tok": (col[1], top, "tokenizer", "chat template,\ntext → ids", "01", "#dbe9f6"),
        "prefill": (col[2], top, "prefill", "the whole prompt\nin one pass", "05", "#f4a259"),
        "sampler": (col[3], top, "sampler", "logits →\none token", "04", "#dbe9f6"),
        "detok": (col[4], top, "detokenizer", "token → text", "01", "#dbe9f6"),
        "stream": (col[5], top, "streamed text", "shown as\nit comes", "10", "#eef1f5"),
        "kv": (col[1] - 0.6, low, "KV cache", "K, V of every\ntoken so far", "06", "#fde2c8"),
        "decode": (col[2], low, "decode step", "one token in;\ncache grows by 1", "05", "#f4a259"),
        "stop": (col[3], low, "stop?", "EOS, stop string,\nmax_tokens", "04", "#fff3bf"),
        "done": (col[4], low, "done", "finish_reason:\nstop / length", "04", "#eef1f5"),
    }
    for x, y, title, detail, ch, colour in boxes.values():
        ax.add_patch(FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0.04,rounding_size=0.14",
                                    fc=colour, ec="#52606d", lw=1.3))
        ax.text(x, y + 0.33, title, ha="center", va="center", fontsize=13, weight="bold")
        ax.text(x, y - 0.2, detail, ha="center", va="center", fontsize=11, color="#323f4b", linespacing=1.15)
        ax.text(x + bw / 2, y - bh / 2 - 0.1, f"ch {ch}", ha="right", va="top", fontsize=10, color="#52606d")

    def arrow(a, b, label="", at=(0.0, 0.0), colour="#323f4b", lw=1.8, ha="center", both=False):
        ax.annotate("", b, a, arrowprops=dict(arrowstyle="<|-|>" if both else "-|>", color=colour, lw=lw,
                                              mutation_scale=16, shrinkA=0, shrinkB=0))
        if label:
            ax.text(at[0], at[1], label, ha=ha, va="center", fontsize=11, color=colour, style="italic")

    def edge(key, dx=0.0, dy=0.0):  # a point on a box's border: dx, dy in -1..1 of its half width and height
        return boxes[key][0] + dx * (bw / 2 + 0.06), boxes[key][1] + dy * (bh / 2 + 0.06)

    for a, b in [("text", "tok"), ("tok", "prefill"), ("prefill", "sampler"), ("sampler", "detok"),
                 ("detok", "stream")]:
        arrow(edge(a, dx=1), edge(b, dx=-1))
    orange, blue = "#c2571a", "#1f6fb2"
    arrow(edge("prefill", dx=-0.55, dy=-1), edge("kv", dx=0.55, dy=1), "fills", at=(4.55, 2.75), colour=orange,
          ha="right")
    arrow(edge("kv", dx=1), edge("decode", dx=-1), colour=orange, both=True)
    # the loop: each sampled token is checked, then fed back as the next step's input
    arrow(edge("sampler", dy=-1), edge("stop", dy=1), colour=blue, lw=2.6)
    arrow(edge("stop", dx=-1), edge("decode", dx=1), "no", at=(col[2] + 1.35, low + 0.25), colour=blue, lw=2.6)
    arrow(edge("decode", dx=0.55, dy=1), edge("sampler", dx=-0.55, dy=-1), colour=blue, lw=2.6)
    arrow(edge("stop", dx=1), edge("done", dx=-1), "yes", at=(col[3] + 1.35, low + 0.25), colour=blue)
    ax.text(col[3] + 0.2, 2.62, "the decode loop:\nthe sampled token is\nthe next step's input", ha="left",
            va="center", fontsize=11, color=blue, weight="bold")
    ax.text(0.05, -0.05, "Around every step: batching many requests (ch 07), quantized weights (ch 08), "
            "TTFT and TPOT (ch 09).", fontsize=11, color="#52606d", va="center")
    ax.set_xlim(0, 15.8)
    ax.set_ylim(-0.3, 4.75)
    ax.axis("off")
    ax.set_title("One request, from text to text", loc="left", fontsize=15, weight="bold")
    fig.tight_layout()
    return fig
