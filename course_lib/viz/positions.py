"""Figures for chapter 2, embeddings and positions (位置编码): encodings, RoPE frequencies and rotations.

Every function returns a matplotlib `Figure` and takes plain tensors or a `ModelConfig`,
so the notebook, a widget and the tests all call the same code.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import torch

from ..config import ModelConfig
from ..model import rope_inv_freq

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _as_numpy(x) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=float)


def _new_axes(ax: Axes | None, figsize=(6, 4.5)) -> tuple[Figure, Axes]:
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
        return fig, ax
    return ax.figure, ax


def matrix_heatmap(matrix, row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None, *,
                   title: str, xlabel: str, ylabel: str, cbar_label: str, ax: Axes | None = None,
                   cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None,
                   center: bool = False) -> Figure:
    """A labelled heatmap of a 2-D matrix (rows top to bottom), with a colour bar.

    `row_labels`/`col_labels` name the ticks (e.g. tokens); `center=True` uses a diverging map
    symmetric around zero (for signed values such as dot products).
    """
    data = _as_numpy(matrix)
    if data.ndim != 2:
        raise ValueError(f"matrix_heatmap needs a 2-D matrix, got shape {data.shape}")
    if row_labels is None and col_labels is None:
        width, height = 7.0, 5.5
    else:  # room for the tick labels (tokens), but bounded
        width = min(11.0, max(4.5, 0.3 * data.shape[1] + 2.5))
        height = min(8.0, max(3.5, 0.25 * data.shape[0] + 2))
    fig, ax = _new_axes(ax, figsize=(width, height))
    if center:
        lim = float(np.nanmax(np.abs(data))) or 1.0
        cmap, vmin, vmax = "RdBu_r", -lim, lim
    im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), col_labels, fontsize=8, rotation=90)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, label=cbar_label)
    return fig


def encoding_heatmap(table, title: str = "Sinusoidal positional encoding", ax: Axes | None = None) -> Figure:
    """Heatmap of a positional-encoding table [positions, dim]: one row per position, one column per dimension."""
    data = _as_numpy(table)
    fig = matrix_heatmap(data, title=title, xlabel="embedding dimension (index)", ylabel="position (token index)",
                         cbar_label="value", ax=ax, center=True)
    return fig


def rope_frequency_plot(config: ModelConfig, context_len: int | None = None) -> Figure:
    """RoPE's rotation speed and wavelength for each 2-D pair of a head, log scale.

    Left: angle per token, theta_i = base^(-2i/d) (radians per token). Right: wavelength 2*pi/theta_i
    (tokens for one full turn), with the context length drawn for comparison.
    """
    import matplotlib.pyplot as plt

    inv_freq = _as_numpy(rope_inv_freq(config))
    wavelength = 2 * math.pi / inv_freq
    pairs = np.arange(len(inv_freq))
    context_len = context_len or config.max_position_embeddings
    fig, (ax_f, ax_w) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    ax_f.semilogy(pairs, inv_freq, "o-", ms=3)
    ax_f.set_xlabel("pair index i (dimensions i and i + d/2)")
    ax_f.set_ylabel(r"rotation speed $\theta_i$ (radians / token)")
    ax_f.set_title("RoPE frequencies")
    ax_w.semilogy(pairs, wavelength, "o-", ms=3, color="tab:orange")
    ax_w.axhline(context_len, color="grey", ls="--", lw=1, label=f"context length {context_len} tokens")
    ax_w.set_xlabel("pair index i (dimensions i and i + d/2)")
    ax_w.set_ylabel(r"wavelength $2\pi/\theta_i$ (tokens)")
    ax_w.set_title("RoPE wavelengths")
    ax_w.legend(fontsize=8, loc="upper left")
    for ax in (ax_f, ax_w):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{config.name or 'model'}: head_dim {config.head_dim}, rope_theta {config.rope_theta:g}")
    return fig


def rope_rotation_plot(inv_freq, pairs: Sequence[int], positions: Sequence[int]) -> Figure:
    """Where the unit vector (1, 0) of each chosen pair lands at each position: RoPE as rotations.

    One panel a pair; a dot per position, numbered. Fast pairs (small i) spin, slow pairs barely move.
    """
    import matplotlib.pyplot as plt

    inv = _as_numpy(inv_freq)
    fig, axes = plt.subplots(1, len(pairs), figsize=(3.3 * len(pairs), 3.6), layout="constrained", squeeze=False)
    circle = np.linspace(0, 2 * math.pi, 200)
    for ax, i in zip(axes[0], pairs):
        angles = np.asarray(positions, dtype=float) * inv[i]
        ax.plot(np.cos(circle), np.sin(circle), color="lightgrey", lw=1)
        ax.scatter(np.cos(angles), np.sin(angles), c=np.asarray(positions), cmap="viridis", s=30, zorder=3)
        labelled: list[tuple[float, float]] = []
        for p, a in zip(positions, angles):  # label a dot unless it sits on top of one already labelled
            xy = (math.cos(a), math.sin(a))
            if all(math.dist(xy, other) > 0.15 for other in labelled):
                ax.annotate(str(p), xy, textcoords="offset points", xytext=(4, 4), fontsize=7)
                labelled.append(xy)
        ax.set_aspect("equal")
        ax.set_xlim(-1.35, 1.35)
        ax.set_ylim(-1.35, 1.35)
        ax.set_xlabel("dimension i (x component)")
        ax.set_ylabel("dimension i + d/2 (y component)")
        ax.set_title(f"pair {i}: $\\theta_{{{i}}}$ = {inv[i]:.3g} rad/token")
    fig.suptitle(r"RoPE rotates each 2-D pair by position $\times\ \theta_i$ (numbers: positions)")
    return fig


def score_heatmap(scores, title: str = "q . k after RoPE, same q and k at every position",
                  ax: Axes | None = None) -> Figure:
    """Heatmap of scores [query position, key position]: constant along diagonals when only the offset matters."""
    return matrix_heatmap(scores, title=title, xlabel="key position (token index)",
                          ylabel="query position (token index)", cbar_label="dot product q . k", ax=ax, center=True)


def score_vs_offset_plot(offsets, curves: Mapping[str, object], title: str = "q . k against relative offset",
                         ax: Axes | None = None) -> Figure:
    """Line plot of dot products against the relative offset (query position - key position), one line a curve."""
    fig, ax = _new_axes(ax, figsize=(7, 3.8))
    x = _as_numpy(offsets)
    for label, y in curves.items():
        ax.plot(x, _as_numpy(y), label=label, lw=1.2)
    ax.set_xlabel("relative offset m - n (tokens)")
    ax.set_ylabel("dot product q . k")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def offset_comparison_plot(offsets, panels: Mapping[str, Mapping[str, object]],
                           title: str = "q . k against relative offset, for several absolute positions") -> Figure:
    """Side-by-side panels, one per position scheme, sharing the y axis; in each, one line per curve.

    `panels` maps a panel title to {curve label: scores}, e.g. {"added (sinusoidal)": {"key at 0": ...,
    "key at 1000": ...}, "rotated (RoPE)": {...}}. Curves that coincide are drawn with different dashes,
    so that lines lying exactly on top of each other stay visible.
    """
    import matplotlib.pyplot as plt

    x = _as_numpy(offsets)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), layout="constrained", sharey=True,
                             squeeze=False)
    dashes = ["-", "--", "-.", ":"]
    for ax, (name, curves) in zip(axes[0], panels.items()):
        for j, (label, y) in enumerate(curves.items()):
            ax.plot(x, _as_numpy(y), ls=dashes[j % len(dashes)], lw=1.6 if j == 0 else 1.2, label=label)
        ax.set_title(name)
        ax.set_xlabel("relative offset m - n (tokens)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("dot product q . k")
    fig.suptitle(title)
    return fig


def mean_direction_plot(cosines, marked: Mapping[str, int] | None = None, bins: int = 24,
                        title: str = "How far each row leans along the table's mean direction") -> Figure:
    """Cosine of every embedding row with the mean row, against the token id; a line for the median per id bin.

    BPE gives later (higher) ids to rarer merges, so the x axis runs roughly from frequent to rare tokens.
    `marked` names tokens to point at, {label: token id}; keep labels to characters the plot font has.
    """
    values = _as_numpy(cosines)
    ids = np.arange(len(values))
    fig, ax = _new_axes(None, figsize=(8, 4))
    ax.scatter(ids, values, s=1, alpha=0.15, color="tab:blue", rasterized=True, label="one token")
    edges = np.linspace(0, len(values), bins + 1).astype(int)
    centres = (edges[:-1] + edges[1:]) / 2
    medians = [float(np.median(values[a:b])) for a, b in zip(edges[:-1], edges[1:])]
    ax.plot(centres, medians, color="tab:orange", lw=2, label=f"median of {len(values) // bins:,} ids")
    for label, i in (marked or {}).items():
        ax.scatter([i], [values[i]], s=30, color="black", zorder=3)
        ax.annotate(label, (i, values[i]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("token id (BPE merge order: frequent -> rare)")
    ax.set_ylabel("cosine with the mean row")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", markerscale=8)
    return fig
