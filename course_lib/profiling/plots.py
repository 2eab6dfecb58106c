"""Matplotlib figures for the profiling chapter: roofline, latency against length, throughput against concurrency."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

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


def plot_latency_vs_length(lengths: Sequence[float], seconds: Sequence[float], ax: Axes | None = None,
                           xlabel: str | None = None, ylabel: str | None = None, title: str | None = None,
                           label: str = "measured", color: str = "tab:blue") -> Axes:
    """Measured latencies (plotted in ms) against a length in tokens, with the least-squares line and its slope.

    Call it again with the same `ax` and another `color` to overlay a second series (labels left as they are).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
        xlabel, ylabel = xlabel or "length (tokens)", ylabel or "latency (ms)"
    x, y = np.asarray(lengths, dtype=float), np.asarray(seconds, dtype=float) * 1e3
    ax.scatter(x, y, s=36, color=color, zorder=3, label=label)
    if len(np.unique(x)) >= 2:
        slope, intercept = np.polyfit(x, y, 1)  # ms per token, ms
        grid = np.linspace(0, x.max() * 1.05, 100)
        per_token = f"{slope:.2f} ms" if abs(slope) >= 1 else f"{slope * 1e3:.1f} µs"
        ax.plot(grid, slope * grid + intercept, color=color, lw=1.2, ls="--",
                label=f"fit: {per_token}/token x length {intercept:+.0f} ms")
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def plot_throughput_vs_concurrency(sweep: pd.DataFrame, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Output tokens/s against concurrency (log2 axis), with p50 TPOT and p90 TTFT (ms) on a second axis.

    `sweep` is `loadtest.sweep_concurrency`'s table. Returns the throughput Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    c = sweep["concurrency"]
    ax.plot(c, sweep["output_throughput"], "o-", color="tab:blue", lw=2, label="output throughput")
    for x, y in zip(c, sweep["output_throughput"]):
        ax.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8,
                    color="tab:blue")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(c), [str(v) for v in c])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output throughput (tokens/s)", color="tab:blue")
    ax.set_ylim(bottom=0)
    lat = ax.twinx()
    lat.plot(c, sweep["tpot_p50"] * 1e3, "s--", color="tab:orange", label="p50 TPOT")
    lat.plot(c, sweep["ttft_p90"] * 1e3, "^:", color="tab:red", label="p90 TTFT")
    lat.set_ylabel("latency (ms)")
    lat.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + lat.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "Throughput and latency against concurrency")
    return ax


def plot_throughput_vs_latency(sweep: pd.DataFrame, latency: str = "tpot_p50", ax: Axes | None = None,
                               title: str | None = None) -> Axes:
    """The serving trade-off curve: output tokens/s against one latency column (ms), each point labelled C=..."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.5))
    x, y = sweep[latency] * 1e3, sweep["output_throughput"]
    ax.plot(x, y, "o-", color="tab:purple", lw=2)
    for c, xi, yi in zip(sweep["concurrency"], x, y):
        ax.annotate(f"C={c}", (xi, yi), textcoords="offset points", xytext=(5, -10), fontsize=8)
    name, stat = latency.rsplit("_", 1)
    ax.set_xlabel(f"{stat} {name.upper().replace('_LATENCY', ' latency')} per request (ms)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "Throughput against latency")
    return ax
