"""Plots of the serving chapter (10): a client-side concurrency sweep and a server's /metrics over time."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure


def plot_concurrency_sweep(sweep: pd.DataFrame, title: str | None = None) -> Figure:
    """Left: TTFT and TPOT (p50, with p90 as the bar's top) against concurrency; right: output tokens/s.

    `sweep` is indexed by concurrency with the columns `course_lib.serve.bench.summarize` returns (seconds).
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = sweep.index.to_numpy()
    for name, color in (("ttft", "tab:orange"), ("tpot", "tab:blue")):
        p50, p90 = sweep[f"{name}_p50"] * 1e3, sweep[f"{name}_p90"] * 1e3
        left.errorbar(x, p50, yerr=[p50 * 0, p90 - p50], marker="o", capsize=4, color=color,
                      label=f"{name.upper()} p50 (bar to p90)")
    left.set_xlabel("concurrent requests")
    left.set_ylabel("ms")
    left.set_xticks(x)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    right.bar([str(c) for c in x], sweep["output_throughput"], color="tab:green")
    for i, v in enumerate(sweep["output_throughput"]):
        right.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    right.set_xlabel("concurrent requests")
    right.set_ylabel("output tokens/s (all requests)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_metrics_timeline(frame: pd.DataFrame, title: str | None = None) -> Figure:
    """Requests running and waiting, and KV cache use, from `MetricsWatcher.frame()` (one row per scrape)."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.step(frame["t"], frame["num_requests_running"], where="post", label="running", color="tab:blue")
    ax.step(frame["t"], frame["num_requests_waiting"], where="post", label="waiting", color="tab:orange")
    ax.set_xlabel("seconds since the watcher started")
    ax.set_ylabel("requests")
    ax.grid(True, alpha=0.3)
    kv = ax.twinx()
    kv.plot(frame["t"], frame["kv_cache_usage_perc"] * 100, color="tab:green", lw=1.2, label="KV cache used")
    kv.set_ylabel("KV cache used (%)")
    kv.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()[0] + kv.get_legend_handles_labels()[0]
    ax.legend(lines, [h.get_label() for h in lines], fontsize=8, loc="upper right")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
