"""Pictures of the two phases of a request (notebooks 00 and 05): the forward passes of one turn, the matmul shapes,
the cost of a prompt, one request's timeline, time floors.

    plot_forward_passes(37, ["'The'", "' capital'", ...])  # a row per forward pass: computed, read from the cache
    plot_prompt_cost([1, 8, 32], prefill_s, decode_s)  # one prefill of n tokens against n decode steps
    plot_phase_shapes(30, 576, 1536)           # [30, 576] @ [576, 1536] (prefill) next to [1, 576] @ [576, 1536]
    plot_request_timeline(out.metrics, labels, n_prompt)  # prefill until the first token (TTFT), then a tick a token
    time_floors(point, ceilings)               # the fastest a step could run on each roof, next to its measured time
    plot_time_floors([prefill, decode], ceilings)
    plot_ttft_and_tpot(per_len, contexts, step_s, prefill_floor_ms, decode_floor_ms, label)  # TTFT, TPOT vs length

Matplotlib's default font has no CJK glyphs, so labels passed in should be ASCII (see `viz.sampling.token_label`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..profiling.metrics import RequestMetrics
    from ..profiling.roofline import Ceilings, RooflinePoint

PREFILL_COLOR, DECODE_COLOR, WEIGHT_COLOR = "#f4a259", "#5b8def", "#cbd2d9"


def _matrix(ax: Axes, x: float, y_top: float, width: float, height: float, color: str, label: str,
            rows: int = 0) -> None:
    """A rectangle hanging from `y_top`, its shape written under it, optional lines between `rows` rows."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y_top - height), width, height, fc=color, ec="#3e4c59", lw=1))
    for r in range(1, rows):
        ax.plot([x, x + width], [y_top - r * height / rows] * 2, color="white", lw=0.8)
    ax.text(x + width / 2, y_top - height - 0.12, label, ha="center", va="top", fontsize=9)


def _phase_panel(ax: Axes, rows: int, rows_drawn: int, row_h: float, hidden: int, out: int, color: str,
                 labels: Sequence[str]) -> None:
    """X [rows, hidden] @ W^T [hidden, out] = Y [rows, out], drawn left to right."""
    H = 2.4  # drawn height of the hidden side of the weight
    w_in, w_out = H, H * out / hidden  # widths proportional to the sizes along the hidden and output sides
    x_h = rows_drawn * row_h
    _matrix(ax, 0, H, w_in, x_h, color, f"X [{rows}, {hidden}]", rows_drawn)
    for i, text in enumerate(labels[:rows_drawn]):
        ax.text(-0.08, H - (i + 0.5) * row_h, text, ha="right", va="center", fontsize=7, color="#52606d")
    if rows > rows_drawn:
        ax.text(w_in / 2, H - x_h - 0.45, f"({rows - rows_drawn} more rows not drawn)", ha="center", va="top",
                fontsize=7, color="#52606d")
    ax.text(w_in + 0.3, H / 2, "@", ha="center", va="center", fontsize=14)
    _matrix(ax, w_in + 0.6, H, w_out, H, WEIGHT_COLOR, f"W^T [{hidden}, {out}]")
    x_eq = w_in + 0.6 + w_out + 0.3
    ax.text(x_eq, H / 2, "=", ha="center", va="center", fontsize=14)
    _matrix(ax, x_eq + 0.3, H, w_out, x_h, color, f"Y [{rows}, {out}]", rows_drawn)
    ax.set_xlim(-1.8, x_eq + 0.4 + w_out)
    ax.set_ylim(-0.9, H + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")


EMPTY, CACHED, PREFILL, DECODE = 0, 1, 2, 3  # cell kinds of `forward_pass_grid`


def forward_pass_grid(prompt_len: int, num_output: int) -> "np.ndarray":
    """[passes, positions] kinds of one greedy turn: pass 0 (prefill) computes positions 0..prompt_len-1; decode pass k
    computes position prompt_len+k-1 (the token sampled by the pass before) and reads every earlier one from the
    KV cache. The last output token is never fed back, so there are prompt_len + num_output - 1 positions."""
    import numpy as np

    if prompt_len < 1 or num_output < 1:
        raise ValueError(f"need prompt_len >= 1 and num_output >= 1, got {prompt_len} and {num_output}")
    grid = np.full((num_output, prompt_len + num_output - 1), EMPTY, dtype=np.int8)
    grid[0, :prompt_len] = PREFILL
    for k in range(1, num_output):
        grid[k, :prompt_len + k - 1] = CACHED
        grid[k, prompt_len + k - 1] = DECODE
    return grid


def plot_forward_passes(prompt_len: int, output_labels: Sequence[str], title: str | None = None) -> Figure:
    """One greedy turn as a grid: a row per forward pass (the prefill, then one per decode step), a column per
    position; each cell says whether that pass computes the position's K and V, reads them from the KV cache, or
    the position does not exist yet. The token each pass produced is written at the end of its row.

    `output_labels`: one short ASCII label per output token (e.g. `viz.sampling.token_label`).
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    grid = forward_pass_grid(prompt_len, len(output_labels))
    passes, positions = grid.shape
    colors = ["white", WEIGHT_COLOR, PREFILL_COLOR, DECODE_COLOR]
    fig, ax = plt.subplots(figsize=(min(14, 3 + 0.22 * positions), 1.6 + 0.32 * passes))
    ax.imshow(grid, cmap=ListedColormap(colors), vmin=0, vmax=3, aspect="auto", interpolation="nearest")
    ax.set_xticks([x - 0.5 for x in range(positions + 1)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(passes + 1)], minor=True)
    ax.grid(which="minor", color="white", lw=0.6)
    ax.tick_params(which="minor", length=0)
    ax.axvline(prompt_len - 0.5, color="#3e4c59", lw=1.2, ls="--")
    ax.set_yticks(range(passes), [f"prefill ({prompt_len} tokens)"] + [f"decode step {k}" for k in range(1, passes)],
                  fontsize=8)
    for k, label in enumerate(output_labels):
        ax.text(positions + 0.1, k, f"-> {label}", va="center", ha="left", fontsize=8)
    ax.set_xlim(-0.5, positions + 4.5)
    ax.set_xlabel(f"position in the sequence: prompt 0..{prompt_len - 1}, then the output tokens fed back")
    ax.legend(handles=[Patch(fc=PREFILL_COLOR, label="K, V computed by the prefill"),
                       Patch(fc=DECODE_COLOR, label="K, V computed by this decode step"),
                       Patch(fc=WEIGHT_COLOR, label="K, V read from the KV cache")],
              loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.6 / passes), ncol=3, fontsize=8, frameon=False)
    ax.set_title(title or "One chat turn, forward pass by forward pass", fontsize=11)
    fig.tight_layout()
    return fig


def plot_prompt_cost(lengths: Sequence[int], prefill_seconds: Sequence[float], decode_seconds: float,
                     title: str | None = None) -> Figure:
    """Time to process a prompt of n tokens: one prefill (measured) against n decode steps (n x one measured step),
    on log axes, with the ratio written at each point."""
    import matplotlib.pyplot as plt

    if len(lengths) != len(prefill_seconds):
        raise ValueError(f"one prefill time per length: {len(lengths)} lengths, {len(prefill_seconds)} times")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    pre = [s * 1e3 for s in prefill_seconds]
    dec = [n * decode_seconds * 1e3 for n in lengths]
    ax.plot(lengths, pre, marker="o", color=PREFILL_COLOR, label="one prefill: all n tokens in one forward pass")
    ax.plot(lengths, dec, marker="s", ls="--", color=DECODE_COLOR,
            label="n decode steps: one token per forward pass")
    for n, p, d in zip(lengths, pre, dec):
        ax.annotate(f"{d / p:.1f}x", (n, (p * d) ** 0.5), ha="center", va="center", fontsize=8, color="#52606d")
    ax.set(xscale="log", yscale="log", xlabel="prompt length n (tokens)", ylabel="time (ms, log scale)")
    ax.set_title(title or "Processing a prompt: one prefill against one token at a time", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, title="numbers: time of n decode steps / time of one prefill", title_fontsize=8)
    return fig


def plot_phase_shapes(num_tokens: int, hidden: int, out_features: int, weight_name: str = "gate_proj",
                      token_labels: Sequence[str] = (), bytes_per_value: int = 4, max_rows: int = 16,
                      title: str | None = None) -> Figure:
    """One weight in both phases: prefill [N, hidden] @ [hidden, out], decode [1, hidden] @ [hidden, out].

    Widths are to scale along the hidden/output sides; rows are drawn one strip per token (at most
    `max_rows`, the same height in both panels). Each panel's caption gives the FLOPs and the weight bytes.
    """
    import matplotlib.pyplot as plt

    rows_drawn = min(num_tokens, max_rows)
    row_h = 2.4 / max(rows_drawn, 8)
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), gridspec_kw={"height_ratios": [1, 1]})
    w_bytes = hidden * out_features * bytes_per_value
    panels = ((axes[0], num_tokens, PREFILL_COLOR, f"prefill of {num_tokens} tokens"),
              (axes[1], 1, DECODE_COLOR, "decode, one step"))
    for ax, rows, color, name in panels:
        labels = token_labels if rows > 1 else ("newest token",) if token_labels else ()
        _phase_panel(ax, rows, min(rows, rows_drawn), row_h, hidden, out_features, color, labels)
        flops = 2 * rows * hidden * out_features
        ax.set_title(f"{name}: {weight_name}\n{flops / 1e6:.1f} MFLOP for {w_bytes / 1e6:.2f} MB of weights read = "
                     f"{flops / w_bytes:.1f} FLOP/byte; each weight used {rows}x", fontsize=10)
    fig.suptitle(title or "One weight matrix, two phases: the rows of X are tokens", fontsize=11)
    fig.tight_layout()
    return fig


def plot_request_timeline(metrics: RequestMetrics, token_labels: Sequence[str], prompt_tokens: int,
                          title: str | None = None) -> Figure:
    """One request on a time axis (ms from arrival): the prefill until the first token (TTFT), then a tick per token.

    `metrics` is a finished request's `RequestMetrics` (`out.metrics`); `token_labels` one short ASCII label per
    output token (its text, or just its number: the default font has no CJK glyphs).
    """
    import matplotlib.pyplot as plt

    t0 = metrics.arrival_time
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    times = [ms(t) for t in metrics.token_times]
    start = ms(metrics.first_scheduled_time if metrics.first_scheduled_time is not None else t0)
    fig, ax = plt.subplots(figsize=(12, 3.2))
    ax.barh(1, times[0] - start, left=start, height=0.5, color=PREFILL_COLOR, ec="#c2571a")
    ax.axvline(times[0], color="#c2571a", ls="--", lw=1)
    ax.annotate(f"<- prefill: {prompt_tokens} prompt tokens in one forward; first token at TTFT = {times[0]:.0f} ms",
                (times[0], 1), xytext=(6, 0), textcoords="offset points", va="center", fontsize=9, color="#c2571a")
    rotation = 60 if max((len(x) for x in token_labels), default=0) > 3 else 0
    for i, (t, label) in enumerate(zip(times, token_labels)):
        left = times[i - 1] if i else start
        if i:
            ax.barh(0, t - left, left=left, height=0.5, color=DECODE_COLOR, ec="white", alpha=0.9)
        ax.plot([t], [0.35 if i else 0.75], marker="v", color="black", ms=5)
        ax.text(t, -0.42, label, rotation=rotation, ha="right" if rotation else "center", va="top", fontsize=7)
    if len(times) > 1:
        tpot = (times[-1] - times[0]) / (len(times) - 1)
        ax.text(times[-1], 0.55, f"decode: 1 token per step, TPOT {tpot:.0f} ms", ha="right", va="bottom", fontsize=9,
                color="#1f4fb4")
    ax.set_yticks([0, 1], ["decode steps", "prefill"])
    ax.set_ylim(-1.6 if rotation else -0.9, 1.8)
    ax.set_xlim(0, times[-1] * 1.03)
    ax.set_xlabel("time since the request arrived (ms)")
    ax.set_title(title or "One request: prefill, first token (TTFT), then decode steps", fontsize=11)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def time_floors(point: RooflinePoint, ceilings: Ceilings) -> dict[str, float]:
    """Seconds: the step's compute floor (FLOPs / peak FLOP/s), memory floor (bytes / bandwidth) and measured median."""
    return {"compute": point.cost.flops / ceilings.peak_flops, "memory": point.cost.bytes / ceilings.bandwidth,
            "measured": point.seconds}


def plot_time_floors(points: Sequence[RooflinePoint], ceilings: Ceilings, title: str | None = None) -> Figure:
    """Per step, three bars (ms, log scale): the compute floor, the memory floor and the measured time.

    The higher floor is the roof that binds; the measured bar can only be longer than both.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 1.1 * len(points)))
    kinds = [("compute", "compute floor: FLOPs / peak FLOP/s", "tab:red"),
             ("memory", "memory floor: bytes / bandwidth", "tab:blue"),
             ("measured", "measured (median)", "black")]
    for row, p in enumerate(points):
        floors = time_floors(p, ceilings)
        for k, (key, label, color) in enumerate(kinds):
            y = row - 0.27 + 0.27 * k
            ax.barh(y, floors[key] * 1e3, height=0.25, color=color, alpha=0.8 if key != "measured" else 0.6,
                    label=label if row == 0 else None)
            ax.text(floors[key] * 1e3 * 1.05, y, f"{floors[key] * 1e3:.3g} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(points)), [p.name for p in points])
    ax.invert_yaxis()
    ax.set_xscale("log")
    lo = min(min(time_floors(p, ceilings).values()) for p in points) * 1e3
    hi = max(max(time_floors(p, ceilings).values()) for p in points) * 1e3
    ax.set_xlim(lo / 2, hi * 6)
    ax.set_xlabel("time of one step (ms, log scale)")
    ax.set_title(title or "How close each step runs to each roof", fontsize=11)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_ttft_and_tpot(per_len: "pd.DataFrame", contexts: Sequence[int], step_seconds: Sequence[float],
                       prefill_floor_ms: Sequence[float], decode_floor_ms: Sequence[float], label: str,
                       engine_context_offset: int = 4) -> Figure:
    """Two panels: TTFT against prompt length (the engine, median per length) and TPOT against context length
    (the model's decode step alone and the engine's), each with its roofline floor as a dotted line.

    `per_len` has one row per prompt length (its index) with "ttft" and "tpot" in seconds; the engine's TPOT is
    placed at prompt + `engine_context_offset` tokens, the middle of its decode steps' contexts."""
    import matplotlib.pyplot as plt

    from ..profiling.plots import plot_latency_vs_length

    lengths = list(per_len.index)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8))
    plot_latency_vs_length(lengths, per_len["ttft"], ax=left, label="TTFT through the engine (median)",
                           xlabel="prompt length (tokens)", ylabel="time to first token (ms)",
                           title=f"TTFT against prompt length\n{label}")
    left.plot(lengths, prefill_floor_ms, "k:", label="roofline floor of the prefill")
    left.set_ylim(0, 1.6 * per_len["ttft"].max() * 1e3)  # room for the legend above the points
    plot_latency_vs_length(contexts, step_seconds, ax=right, color="tab:green",
                           label="model decode step alone (contiguous cache)",
                           xlabel="context length (tokens in the KV cache)", ylabel="time per output token (ms)",
                           title=f"TPOT against context length\n{label}")
    plot_latency_vs_length([n + engine_context_offset for n in lengths], per_len["tpot"], ax=right,
                           label="TPOT through the engine (paged cache, sampler; median)")
    right.plot(contexts, decode_floor_ms, "k:", label="roofline floor of a decode step")
    right.set_ylim(0, 1.6 * max(per_len["tpot"].max(), *step_seconds) * 1e3)
    for ax in (left, right):
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
