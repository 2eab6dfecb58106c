"""Matplotlib figures for the profiling chapter."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .roofline import Ceilings, RooflinePoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def plot_roofline(ceilings: Ceilings, points: Sequence[RooflinePoint] = (), ax: Axes | None = None,
                  title: str | None = None) -> Axes:
    """Log-log roofline: attainable FLOP/s against arithmetic intensity, with measured steps as dots.

    Each point is labelled with its fraction of the roof above it. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.intensity for p in points] + [ceilings.ridge_point]
    lo, hi = min(xs) / 4, max(xs) * 4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    roof = np.minimum(ceilings.peak_flops, grid * ceilings.bandwidth)
    ax.loglog(grid, roof / 1e9, color="black", lw=2, label="roof: min(peak, intensity x bandwidth)")
    ax.axvline(ceilings.ridge_point, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ceilings.ridge_point:.1f} FLOP/B", (ceilings.ridge_point, ceilings.peak_flops / 1e9),
                textcoords="offset points", xytext=(4, -14), fontsize=8, color="grey")
    ax.text(lo * 1.2, lo * 1.2 * ceilings.bandwidth / 1e9, f"  {ceilings.bandwidth / 1e9:.1f} GB/s",
            rotation=0, va="bottom", fontsize=8)
    ax.text(hi / 1.2, ceilings.peak_flops / 1e9, f"{ceilings.peak_flops / 1e9:.0f} GFLOP/s  ",
            ha="right", va="bottom", fontsize=8)
    for p, color in zip(points, ["tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple"] * 4):
        ax.scatter([p.intensity], [p.achieved_flops / 1e9], s=50, color=color, zorder=3,
                   label=f"{p.name}: {p.fraction_of_roof(ceilings):.0%} of roof")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("performance (GFLOP/s)")
    ax.set_title(title or f"Roofline, {ceilings.device} {ceilings.dtype} (measured ceilings)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax
