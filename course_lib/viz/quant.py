"""Plots of the quantization chapter (notebook 08): a GGUF block byte by byte, grids of levels, errors, trade-offs.

    plot_q4_1_block(block)                          # 20 bytes: d, m, 16 bytes of codes, and the 32 codes they hold
    plot_levels(w[:32], [levels_g32, levels_g128])  # the same weights on two grids of 16 levels
    plot_error_vs_bound(half_step, max_err)         # one dot per row: the error never passes half a step
    plot_format_tradeoffs(rows)                     # memory, KL divergence and speed of each format

Every function takes numbers computed in the notebook and returns the matplotlib Figure.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Mapping, Sequence

import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Q4_1_BYTES = 20  # | d: f16 | m: f16 | qs: 16 x uint8 |
_COLOURS = {"d": "#f4a259", "m": "#8ecae6", "qs": "#e9ecef", "low": "#d8f3dc", "high": "#ffd6a5"}


def split_q4_1(block: bytes) -> tuple[float, float, list[int], list[int]]:
    """One Q4_1 block -> (d, m, low nibbles, high nibbles): w[i] = d * low[i] + m, w[i + 16] = d * high[i] + m."""
    if len(block) != Q4_1_BYTES:
        raise ValueError(f"a Q4_1 block is {Q4_1_BYTES} bytes, got {len(block)}")
    d, m = struct.unpack("<ee", block[:4])  # two little-endian float16
    qs = block[4:]
    return d, m, [b & 0x0F for b in qs], [b >> 4 for b in qs]


def plot_q4_1_block(block: bytes, title: str = "One Q4_1 block: 20 bytes hold 32 weights") -> Figure:
    """The 20 bytes of a Q4_1 block as boxes (hex), and under each code byte the two 4-bit codes it packs."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    d, m, low, high = split_q4_1(block)
    fig, ax = plt.subplots(figsize=(13, 3.4))
    kinds = ["d"] * 2 + ["m"] * 2 + ["qs"] * 16

    def box(x: float, y: float, text: str, colour: str, size: int = 9) -> None:
        ax.add_patch(Rectangle((x, y), 0.92, 0.8, fc=colour, ec="#52606d", lw=0.8))
        ax.text(x + 0.46, y + 0.4, text, ha="center", va="center", fontsize=size, family="monospace")

    for i, (b, kind) in enumerate(zip(block, kinds)):
        box(i, 2.0, f"{b:02x}", _COLOURS[kind])
        ax.text(i + 0.46, 2.95, str(i), ha="center", fontsize=7, color="#52606d")
    for j in range(16):
        box(4 + j, 1.0, f"{low[j]}", _COLOURS["low"], 8)
        box(4 + j, 0.0, f"{high[j]}", _COLOURS["high"], 8)
    ax.text(0.96, 1.55, f"d = {d:.6g}\n(float16)", ha="center", va="center", fontsize=8)
    ax.text(2.96, 1.55, f"m = {m:.6g}\n(float16)", ha="center", va="center", fontsize=8)
    ax.text(20.1, 1.4, "<- low nibble: w[0..15]", ha="left", va="center", fontsize=8)
    ax.text(20.1, 0.4, "<- high nibble: w[16..31]", ha="left", va="center", fontsize=8)
    ax.text(20.1, 2.4, "<- the 20 bytes (hex)", ha="left", va="center", fontsize=8)
    ax.set_xlim(-0.2, 23.6)
    ax.set_ylim(-0.2, 3.2)
    ax.axis("off")
    ax.set_title(title + "   (w = d * code + m)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_levels(values: torch.Tensor, grids: Sequence[torch.Tensor], labels: Sequence[str],
                title: str) -> Figure:
    """One panel per grid: `values` [n] as dots, the grid's levels as lines, and a red bar from each
    value to the level it rounds to (its quantization error)."""
    import matplotlib.pyplot as plt

    v = values.detach().float().cpu()  # [n]
    fig, axes = plt.subplots(1, len(grids), figsize=(5.5 * len(grids), 3.6), sharey=True, squeeze=False)
    for ax, levels, label in zip(axes[0], grids, labels):
        lv = levels.detach().float().cpu().flatten()  # [n_levels]
        nearest = lv[(v[:, None] - lv[None, :]).abs().argmin(dim=1)]  # [n]
        for y in lv.tolist():
            ax.axhline(y, color="#9aa5b1", lw=0.6)
        idx = torch.arange(len(v))
        ax.vlines(idx, v, nearest, color="#d62828", lw=2.5)
        ax.plot(idx, nearest, "_", ms=9, mew=2, color="#d62828")  # where the weight is rounded to
        ax.plot(idx, v, "o", ms=4, color="#1d3557")
        err = (v - nearest).abs().max().item()
        ax.set_title(f"{label}\nlargest |error| {err:.2g}", fontsize=9)
        ax.set_xlabel("position in the row")
    axes[0][0].set_ylabel("weight value")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_error_vs_bound(half_step: torch.Tensor, max_error: torch.Tensor, title: str) -> Figure:
    """One dot per row: the largest |W - dequantized W| against half the row's quantization step."""
    import matplotlib.pyplot as plt

    x, y = half_step.detach().float().cpu(), max_error.detach().float().cpu()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(x, y, ".", ms=3, alpha=0.6, label="one row")
    top = max(x.max().item(), y.max().item()) * 1.05
    ax.plot([0, top], [0, top], "--", color="#d62828", lw=1, label="bound: error = step / 2")
    ax.set_xlabel("half a quantization step, scale / 2")
    ax.set_ylabel("largest |error| in the row")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_format_tradeoffs(rows: Mapping[str, Mapping[str, float]], title: str) -> Figure:
    """Three panels, one bar per format: weight memory (MB), KL divergence to the reference (log
    scale), and decode / prefill speed relative to the reference (the first row).

    rows: {format: {"linear_mb", "other_mb", "kl", "decode_tok_s", "prefill_tok_s"}}.
    """
    import matplotlib.pyplot as plt

    names = list(rows)
    ref = rows[names[0]]
    x = torch.arange(len(names)).float()
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 3.8))
    lin = [rows[n]["linear_mb"] for n in names]
    other = [rows[n]["other_mb"] for n in names]
    a1.bar(x, lin, color="#457b9d", label="linear layers")
    a1.bar(x, other, bottom=lin, color="#a8dadc", label="embedding (= lm_head) + norms")
    a1.set_ylabel("weight memory (MB)")
    a1.legend(fontsize=8)
    kl = [max(rows[n]["kl"], 1e-6) for n in names]
    a2.bar(x, kl, color="#e76f51")
    a2.set_yscale("log")
    a2.set_ylabel(f"KL({names[0]} || format), nats/token")
    for i, n in enumerate(names):
        a2.text(i, kl[i], f"{rows[n]['kl']:.1e}" if rows[n]["kl"] > 0 else "0", ha="center", va="bottom", fontsize=7)
    w = 0.38
    a3.bar(x - w / 2, [rows[n]["decode_tok_s"] / ref["decode_tok_s"] for n in names], w, color="#2a9d8f",
           label="decode (1 token a step)")
    a3.bar(x + w / 2, [rows[n]["prefill_tok_s"] / ref["prefill_tok_s"] for n in names], w, color="#e9c46a",
           label="prefill")
    a3.axhline(1, color="black", lw=0.8)
    a3.set_ylabel(f"tokens/s relative to {names[0]}")
    a3.legend(fontsize=8)
    for ax in (a1, a2, a3):
        ax.set_xticks(x.tolist(), names, rotation=20, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
