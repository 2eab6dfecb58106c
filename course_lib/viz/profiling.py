"""Plots for the profiling chapter: one request's timeline, latency distributions, a load test's
percentiles against concurrency, the profiler's top operators and where the memory goes.

    from course_lib.viz import profiling as vp
    fig = vp.plot_request_timeline(out.metrics, title="One request, cpu")

Every function takes numbers measured by `course_lib.profiling` (seconds, bytes) and draws them in
milliseconds and MiB; none of them measures anything itself.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..profiling.metrics import PERCENTILES, RequestMetrics

MiB = 2 ** 20
PERCENTILE_STYLES = {50: ("-", "o"), 90: ("--", "s"), 99: (":", "^")}


def plot_request_timeline(metrics: RequestMetrics, title: str = "One request") -> Figure:
    """Top: the request's events on one time axis (ms since arrival) with TTFT, decode and e2e spans.
    Bottom: the gap before each token after the first (the ITLs) and their mean, the TPOT."""
    t0 = metrics.arrival_time
    tokens = (np.asarray(metrics.token_times) - t0) * 1e3  # [num_output_tokens] ms since arrival
    ttft, e2e = metrics.ttft * 1e3, metrics.e2e_latency * 1e3
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.2), height_ratios=[1.1, 1.4])

    top.vlines(tokens, 0.55, 0.95, color="tab:blue", lw=1)
    top.plot([0], [0.75], "k>", ms=8)
    top.text(0, 1.0, "arrival", ha="left", va="bottom", fontsize=8)
    top.text(tokens[0], 1.0, "first token", ha="center", va="bottom", fontsize=8, color="tab:blue")
    top.text(e2e, 1.0, "finished", ha="right", va="bottom", fontsize=8)
    spans = [(0, ttft, 0.35, "TTFT", "tab:red"),
             (ttft, e2e, 0.35, f"decode: {len(tokens) - 1} gaps = (n - 1) x TPOT", "tab:orange"),
             (0, e2e, 0.1, "end-to-end latency", "black")]
    for start, end, y, label, color in spans:
        top.annotate("", (end, y), (start, y), arrowprops=dict(arrowstyle="<->", color=color, lw=1.4))
        top.text((start + end) / 2, y + 0.04, f"{label}: {end - start:.0f} ms", ha="center", va="bottom",
                 fontsize=8, color=color)
    top.set_ylim(0, 1.25)
    top.set_yticks([])
    top.set_xlim(-0.01 * e2e, e2e * 1.01)
    top.set_xlabel("time since arrival (ms); one blue tick per output token")
    top.set_title(title)

    itl = np.diff(tokens)  # [num_output_tokens - 1] ms
    bottom.bar(np.arange(2, len(tokens) + 1), itl, color="tab:orange", width=0.8, label="ITL before token i")
    if len(itl):
        bottom.axhline(itl.mean(), color="black", lw=1.2, ls="--", label=f"mean ITL = TPOT = {itl.mean():.1f} ms")
    bottom.set_xlabel("output token i")
    bottom.set_ylabel("inter-token latency (ms)")
    bottom.set_xlim(0.3, len(tokens) + 0.7)
    bottom.legend(fontsize=8, loc="lower right")
    bottom.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_latency_cdf(samples: Mapping[str, Sequence[float]], ps: Sequence[float] = PERCENTILES,
                     xlabel: str = "latency (ms)", title: str | None = None, ax: Axes | None = None) -> Axes:
    """Empirical CDF of each series of latencies (seconds, drawn in ms), its percentiles marked.

    The p-th percentile is where the curve crosses p%: read p99 off the right end, where the tail is.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (name, values), color in zip(samples.items(), colors * 4):
        xs = np.sort(np.asarray(values, dtype=float)) * 1e3  # [n] ms, ascending
        if xs.size == 0:
            continue
        ys = np.arange(1, xs.size + 1) / xs.size * 100
        ax.step(xs, ys, where="post", color=color, lw=1.6, label=f"{name} (n={xs.size})")
        for p, x in zip(ps, np.percentile(xs, ps)):
            ax.plot([x], [p], PERCENTILE_STYLES.get(p, ("-", "o"))[1], color=color, ms=5)
    for p in ps:
        ax.axhline(p, color="grey", lw=0.6, ls=":")
        ax.text(1.0, p, f" p{p:g}", transform=ax.get_yaxis_transform(), va="center", fontsize=7, color="grey")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of samples at or below (%)")
    ax.set_ylim(0, 101)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return ax


def plot_load_percentiles(sweep: pd.DataFrame, ps: Sequence[float] = PERCENTILES,
                          title: str = "Load test") -> Figure:
    """Three panels against concurrency: output throughput (tokens/s), TTFT and TPOT percentiles (ms).

    `sweep` has one row per level with columns concurrency, output_throughput and ttft_p50 ... tpot_p99
    (a `summarize` dict per level, as `run_load_test(...).summary` gives).
    """
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    c = sweep["concurrency"].to_numpy()
    axes[0].plot(c, sweep["output_throughput"], "o-", color="tab:blue", lw=2)
    for x, y in zip(c, sweep["output_throughput"]):
        axes[0].annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    axes[0].set_ylabel("output throughput (tokens/s)")
    axes[0].set_title("throughput: all requests together")
    for ax, metric, name in ((axes[1], "ttft", "TTFT"), (axes[2], "tpot", "TPOT")):
        for p in ps:
            ls, marker = PERCENTILE_STYLES.get(p, ("-", "o"))
            ax.plot(c, sweep[f"{metric}_p{p:g}"] * 1e3, ls=ls, marker=marker, label=f"p{p:g}")
        ax.set_ylabel(f"{name} per request (ms)")
        ax.set_title(f"{name} percentiles: each request")
        ax.legend(fontsize=8, loc="upper left")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(c), [str(v) for v in c])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def short_op_name(op: str, width: int = 30) -> str:
    """An operator's name for a plot label: no "aten::", scaled_dot_product_* as "sdpa ...", cut to `width`."""
    name = op.removeprefix("aten::")
    if "scaled_dot_product" in name:
        name = "sdpa " + name.split("scaled_dot_product_", 1)[1].replace("_attention", "").replace("_", " ")
    return name if len(name) <= width else name[:width - 1] + "…"


def plot_top_ops(ops: pd.DataFrame, n: int = 8, title: str = "Top operators") -> Figure:
    """Side by side for prefill and decode: the `n` operators with the most self time (ms), with their
    share of the phase. `ops` is `profile_steps(..., row_limit=None)`'s table."""
    key = "self_device_ms" if "self_device_ms" in ops else "self_cpu_ms"
    phases = list(dict.fromkeys(ops["phase"]))
    fig, axes = plt.subplots(1, len(phases), figsize=(6.5 * len(phases), 0.42 * n + 1.6))
    for ax, phase in zip(np.atleast_1d(axes), phases):
        rows = ops[ops["phase"] == phase]
        total = rows[key].sum()
        top = rows.nlargest(n, key)[::-1]
        ax.barh([short_op_name(op) for op in top["op"]], top[key], color="tab:purple")
        for y, (ms, calls) in enumerate(zip(top[key], top["calls"])):
            ax.text(ms, y, f" {ms:.1f} ms, {ms / total:.0%}, {calls} calls", va="center", fontsize=7)
        ax.set_xlim(0, top[key].max() * 1.6)
        ax.set_xlabel(f"self time ({'GPU' if key == 'self_device_ms' else 'CPU'}, ms)")
        ax.set_title(f"{phase}: {total:.1f} ms in all, {int(rows['calls'].sum())} op calls", fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_memory(parts: Mapping[str, float], stack: Mapping[str, float] | None = None,
                stack_label: str = "measured total", title: str = "Where the memory goes",
                ax: Axes | None = None) -> Axes:
    """Horizontal bars of bytes (drawn in MiB), each labelled with its size; `stack`, if given, is one
    more bar on top made of segments (e.g. a measured total split into what is known to be in it)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 * (len(parts) + bool(stack)) + 1.6))
    names = list(parts)[::-1]
    mib = np.array([parts[k] for k in names], dtype=float) / MiB
    ax.barh(names, mib, color=[_memory_color(k) for k in names])
    for y, v in enumerate(mib):
        ax.text(v, y, f" {v:,.1f} MiB", va="center", fontsize=8)
    right = mib.max()
    if stack:
        y, left = len(names), 0.0
        for (name, b), hatch in zip(stack.items(), ["", "", "", "//", "..", "xx"]):
            width = b / MiB
            ax.barh([stack_label], [width], left=left, color=_memory_color(name), hatch=hatch, edgecolor="white",
                    label=f"{name}: {width:,.0f} MiB")
            left += width
        ax.text(left, y, f" {left:,.0f} MiB", va="center", fontsize=8)
        ax.legend(fontsize=7, loc="lower right", title=stack_label, title_fontsize=7)
        right = max(right, left)
    ax.set_xlim(0, right * 1.25)
    ax.set_xlabel("memory (MiB)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def _memory_color(name: str) -> str:
    name = name.lower()
    for key, color in (("kv", "tab:green"), ("weight", "tab:blue"), ("activ", "tab:orange"), ("librar", "tab:purple")):
        if key in name:
            return color
    return "tab:grey"
