"""Pictures of scaling out (notebook 13): what fits on a card, three ways to split, one layer split by ranks.

    plot_fit(splits, capacities)   # weights + KV of each model on one card (labelled GB), against cards' usable memory
    draw_parallelism()             # data, pipeline and tensor parallelism side by side
    draw_layer_split(tp=2)         # the MLP: column-parallel up, row-parallel down, one all-reduce
    plot_link_times(rows)          # seconds of all-reduce per step over each link, against the compute time
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..planner import SplitPlan

RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")


def plot_fit(splits: Mapping[str, SplitPlan], capacities: Mapping[str, float]) -> Figure:
    """Stacked weights and KV cache of each model on one device (GB, linear axis), each part labelled with its GB,
    with each card's usable memory as a line. A linear axis keeps the small model's bars honest next to the big ones;
    the labels keep them readable."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    names = list(splits)
    weights = [splits[n].weight_bytes / 1e9 for n in names]
    kv = [splits[n].kv_bytes / 1e9 for n in names]
    ax.bar(names, weights, color=RANK_COLORS[0], label="weights")
    ax.bar(names, kv, bottom=weights, color=RANK_COLORS[1], label="KV cache")
    top = max(w + k for w, k in zip(weights, kv))
    for i, (w, k) in enumerate(zip(weights, kv)):
        ax.text(i, w + k + top * 0.015, f"weights {w:.0f} GB\n+ KV {k:.0f} GB", ha="center", va="bottom", fontsize=8,
                bbox=dict(facecolor="white", edgecolor="none", pad=0.5))  # readable where a card's line crosses
    for (card, gb), style in zip(capacities.items(), (":", "--", "-.")):
        ax.axhline(gb, color="0.3", linestyle=style, linewidth=1)
        ax.text(len(names) - 0.45, gb, f"{card}: {gb:.0f} GB usable", fontsize=8, ha="left", va="bottom")
    ax.set_xlim(-0.5, len(names) + 0.75)
    ax.set_ylim(0, top * 1.18)
    ax.set_ylabel("GB on one device (1 GB = 1e9 bytes)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def _box(ax, x, y, w, h, color, text="", alpha=0.85, fontsize=8):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="white", alpha=alpha))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color="white")


def draw_parallelism() -> Figure:
    """Three panels, two devices each: whole copies (data), halves of the layer stack (pipeline), halves of
    every layer (tensor). Colours are devices."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
    layers = 6
    for ax, title in zip(axes, ("data parallel: a copy each,\nrequests split",
                                "pipeline parallel: layers split,\nactivations passed on",
                                "tensor parallel: every layer split,\nall-reduce after each half")):
        ax.set_title(title, fontsize=9)
        ax.set_xlim(0, 4)
        ax.set_ylim(-0.6, layers + 0.4)
        ax.axis("off")
    for i in range(layers):  # data: two full stacks
        _box(axes[0], 0.3, i, 1.5, 0.85, RANK_COLORS[0], f"layer {i}")
        _box(axes[0], 2.2, i, 1.5, 0.85, RANK_COLORS[1], f"layer {i}")
        device = 0 if i < layers // 2 else 1  # pipeline: the lower half on device 0
        _box(axes[1], 1.0, i, 2.0, 0.85, RANK_COLORS[device], f"layer {i}")
        _box(axes[2], 0.6, i, 1.4, 0.85, RANK_COLORS[0], "½")
        _box(axes[2], 2.0, i, 1.4, 0.85, RANK_COLORS[1], "½")
        axes[2].annotate("", xy=(3.75, i + 0.1), xytext=(3.75, i + 0.75),
                         arrowprops=dict(arrowstyle="<->", color="0.3", lw=0.8))
    axes[0].text(1.05, -0.45, "users A, C, ...", ha="center", fontsize=8)
    axes[0].text(2.95, -0.45, "users B, D, ...", ha="center", fontsize=8)
    axes[1].annotate("", xy=(2.0, layers // 2 + 0.05), xytext=(2.0, layers // 2 - 0.2),
                     arrowprops=dict(arrowstyle="->", color="k", lw=1.5))
    axes[1].text(3.05, layers // 2 - 0.25, "one send\nper token", fontsize=8)
    axes[2].text(2.0, -0.45, "every user on both devices", ha="center", fontsize=8)
    fig.tight_layout()
    return fig


def draw_layer_split(tp: int = 2) -> Figure:
    """The MLP over `tp` ranks: x is on every rank; W_up's output columns and W_down's input rows are split the
    same way, so each rank's half of the hidden activation stays on that rank; one all-reduce sums the outputs."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.axis("off")
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.3, 4.4)
    _box(ax, 0.1, 1.2, 0.6, 2.0, "0.45", "x\n[h]")
    width = 2.6 / tp
    for r in range(tp):
        c = RANK_COLORS[r % len(RANK_COLORS)]
        _box(ax, 1.3 + r * width, 1.2, width, 2.0, c, f"W_up\ncols\nrank {r}")  # column-parallel
        _box(ax, 4.5 + r * width, 1.9, width, 0.6, c, f"a_{r}")  # the rank's slice of the activation
        _box(ax, 7.6, 0.2 + r * 3.4 / tp, 2.0, 3.2 / tp, c, f"W_down rows, rank {r}")  # row-parallel
    ax.text(2.6, 3.5, "column-parallel:\nno communication", ha="center", fontsize=9)
    ax.text(5.8, 3.5, "SiLU(gate) x up:\nelementwise, stays local", ha="center", fontsize=9)
    ax.text(8.6, 3.7, "row-parallel:\npartial sums y_r", ha="center", fontsize=9)
    ax.annotate("", xy=(10.7, 2.2), xytext=(9.7, 2.2), arrowprops=dict(arrowstyle="->", lw=1.5))
    _box(ax, 10.8, 1.2, 0.9, 2.0, "0.25", "y = Σ y_r\nall-\nreduce", fontsize=8)
    fig.tight_layout()
    return fig


def plot_link_times(rows: Sequence[Mapping], title: str) -> Figure:
    """Horizontal bars: seconds of communication per step over each link (`rows`: link, comm_s, compute_s)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.5 + 0.45 * len(rows)))
    names = [r["link"] for r in rows]
    ax.barh(names, [r["comm_s"] * 1e3 for r in rows], color=RANK_COLORS[1], label="all-reduce (ring, bandwidth)")
    ax.axvline(rows[0]["compute_s"] * 1e3, color=RANK_COLORS[0], linestyle="--",
               label="compute of the same step on each GPU")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
