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
