"""Figures of chapter 6, the KV cache (KV 缓存): recompute vs cache, memory budgets, fragmentation, block tables.

Every function takes plain numbers measured or simulated in the notebook and returns a matplotlib `Figure`:

    plot_generation_cost(step_s_no_cache, step_s_cache, prompt_len)    # per-step and cumulative time
    plot_stacked_bars({"Llama-3-8B": {"weights": 16.1, "KV cache": 34.4}}, unit="GB", lines={"H100": 80})
    plot_memory_map({"contiguous": [(start, reserved, used), ...]}, pool_tokens)   # holes and slack
    plot_block_tables([("after step 1", {"A": ([3, 7], 6)})], num_blocks=16, block_size=4)
    plot_ttft_pairs(ttft_without, ttft_with)                            # prefix caching, per request
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Colours of the parts of memory, the same in every figure of the chapter.
PART_COLOURS = {"weights": "#52606d", "KV cache": "#f4a259", "activations": "#8bb8e8",
                "KV in use": "#2a9d8f", "reserved, unused (internal)": "#e9c46a",
                "free, unusable (external)": "#e76f51", "free": "#eef1f5"}
SEQ_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
SHARED_COLOUR = "#7f7f7f"


def _figure(figsize: tuple[float, float], ncols: int = 1, nrows: int = 1, **kw) -> tuple[Figure, np.ndarray]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, layout="constrained", squeeze=False, **kw)
    return fig, axes


def plot_generation_cost(step_s_no_cache: Sequence[float], step_s_cache: Sequence[float], prompt_len: int,
                         title: str = "Generation without and with a KV cache") -> Figure:
    """Left: seconds of each step against the sequence length it reaches; right: cumulative seconds against
    tokens generated. Step i of both loops makes token i; without a cache it reprocesses all prompt_len + i tokens."""
    no, yes = np.asarray(step_s_no_cache, float), np.asarray(step_s_cache, float)
    if len(no) != len(yes):
        raise ValueError(f"need one time per step for both loops, got {len(no)} and {len(yes)}")
    fig, axes = _figure((11, 4), ncols=2)
    ax_step, ax_cum = axes[0]
    length = prompt_len + np.arange(len(no))  # tokens in the sequence when step i runs
    ax_step.plot(length, no * 1e3, ".", ms=4, color="#e76f51", label="no cache: recompute all tokens")
    ax_step.plot(length, yes * 1e3, ".", ms=4, color="#2a9d8f", label="KV cache: one new token")
    ax_step.set_xlabel("tokens in the sequence at this step")
    ax_step.set_ylabel("time of the step (ms)")
    ax_step.set_ylim(bottom=0)
    ax_step.legend(fontsize=8)
    ax_step.set_title("Each step")
    n = np.arange(1, len(no) + 1)
    ax_cum.plot(n, np.cumsum(no), color="#e76f51", label="no cache (grows ~ n^2)")
    ax_cum.plot(n, np.cumsum(yes), color="#2a9d8f", label="KV cache (grows ~ n)")
    ax_cum.set_xlabel("new tokens generated (n)")
    ax_cum.set_ylabel("total time (s)")
    ax_cum.set_ylim(bottom=0)
    ax_cum.legend(fontsize=8)
    ax_cum.set_title("All steps so far")
    for ax in (ax_step, ax_cum):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    return fig


def plot_stacked_bars(rows: Mapping[str, Mapping[str, float]], unit: str, title: str,
                      lines: Mapping[str, float] | None = None, percent: bool = False,
                      line_colour: str = "black") -> Figure:
    """One horizontal bar per row, split into its parts (e.g. weights / KV cache / activations), with the
    total written at the end; `lines` draws labelled vertical limits (e.g. a GPU's memory) above the bars:
    the largest solid, the others dashed."""
    names = list(rows)
    parts = list(dict.fromkeys(p for r in rows.values() for p in r))
    fig, axes = _figure((10, 0.6 * len(names) + 2.2))
    ax = axes[0, 0]
    left = np.zeros(len(names))
    for part in parts:
        vals = np.array([rows[n].get(part, 0.0) for n in names], float)
        ax.barh(names, vals, left=left, color=PART_COLOURS.get(part), label=part, edgecolor="white", linewidth=0.5)
        left += vals
    if not percent:
        for y, total in enumerate(left):
            ax.annotate(f"{total:,.1f} {unit}", (total, y), textcoords="offset points", xytext=(4, 0),
                        va="center", fontsize=8)
    top = max(left.max(), max((lines or {}).values(), default=0.0))
    ordered = sorted((lines or {}).items(), key=lambda kv: kv[1])
    for i, (label, x) in enumerate(ordered):
        ax.axvline(x, color=line_colour, ls="-" if i == len(ordered) - 1 and line_colour != "black" else "--", lw=1.5)
        ax.text(x, 1.02 + 0.07 * (i % 2), label, transform=ax.get_xaxis_transform(), ha="center", fontsize=8)
    ax.set_xlim(0, 100 if percent else top * 1.18)
    ax.invert_yaxis()
    ax.set_xlabel("share of memory (%)" if percent else f"memory ({unit})")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(parts), frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, pad=28 if lines else 6)
    return fig


def plot_memory_map(rows: Mapping[str, Sequence[tuple[int, int, int]]], pool_tokens: int, title: str) -> Figure:
    """Each row is one pool of KV memory at one moment: segments (start, reserved, used) in token slots.

    Used slots are dark, reserved-but-unused light, free slots (holes) white. Contiguous reservation: one
    segment per request; paged: one segment per block."""
    import matplotlib.patches as mpatches

    fig, axes = _figure((11, 0.8 * len(rows) + 1.6))
    ax = axes[0, 0]
    for y, (name, segments) in enumerate(rows.items()):
        ax.barh(y, pool_tokens, color=PART_COLOURS["free"], edgecolor="#9aa5b1", height=0.6)
        edge = 0.3 if len(segments) < 200 else 0.0  # many small segments (blocks): no edges, or they grey out
        for start, reserved, used in segments:
            ax.barh(y, reserved, left=start, color=PART_COLOURS["reserved, unused (internal)"], height=0.6,
                    edgecolor="white", linewidth=edge)
            ax.barh(y, used, left=start, color=PART_COLOURS["KV in use"], height=0.6, linewidth=0)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()
    ax.set_xlim(0, pool_tokens)
    ax.set_xlabel("KV memory (token slots)")
    handles = [mpatches.Patch(color=PART_COLOURS[k], label=label) for k, label in
               [("KV in use", "holds a token's K and V"), ("reserved, unused (internal)", "reserved, empty"),
                ("free", "free")]]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    ax.set_title(title)
    return fig


def _seq_colours(names: Sequence[str]) -> dict[str, str]:
    return {n: SEQ_COLOURS[i % len(SEQ_COLOURS)] for i, n in enumerate(names)}


def plot_block_tables(snapshots: Sequence[tuple[str, Mapping[str, tuple[Sequence[int], int]]]],
                      num_blocks: int, block_size: int, title: str = "Block tables: logical blocks -> physical blocks"
                      ) -> Figure:
    """One panel per snapshot: left, each sequence's block table (logical block i -> physical block id, the
    filled part of each block shaded); right, the physical blocks, coloured by the sequence(s) holding them.

    A snapshot is (caption, {sequence name: (block_table, tokens with K/V in the cache)}).
    A physical block held by several sequences (a shared prefix) is grey and lists its owners."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(n for _, seqs in snapshots for n in seqs))
    colour = _seq_colours(names)
    width = max([4] + [len(t) for _, seqs in snapshots for t, _ in seqs.values()])
    cols = min(num_blocks, 16)
    grid_rows = -(-num_blocks // cols)
    heights = [max(len(seqs), grid_rows, 1) for _, seqs in snapshots]
    fig = plt.figure(figsize=(12, sum(0.6 * h + 1.0 for h in heights) + 0.4), layout="constrained")
    subfigs = fig.subfigures(len(snapshots), 1, height_ratios=[0.6 * h + 1.0 for h in heights], squeeze=False)[:, 0]
    for sub, (caption, seqs), h in zip(subfigs, snapshots, heights):
        ax_t, ax_p = sub.subplots(1, 2, width_ratios=[width + 1, cols])
        sub.suptitle(caption, x=0.01, ha="left", fontsize=10)
        owners: dict[int, list[str]] = {}
        for y, (name, (table, tokens)) in enumerate(seqs.items()):
            for i, block in enumerate(table):
                owners.setdefault(block, []).append(name)
                filled = min(block_size, max(0, tokens - i * block_size)) / block_size
                ax_t.add_patch(_box(i, y, colour[name], alpha=0.25))
                ax_t.add_patch(_box(i, y, colour[name], alpha=0.9, width=filled))
                ax_t.text(i + 0.45, y + 0.4, str(block), ha="center", va="center", fontsize=8, weight="bold")
        ax_t.set_xlim(-0.1, width)
        ax_t.set_ylim(h, -0.1)
        ax_t.set_yticks([y + 0.4 for y in range(len(seqs))], [f"{n} ({t} tok)" for n, (_, t) in seqs.items()],
                        fontsize=8)
        ax_t.set_xticks([i + 0.45 for i in range(width)], [str(i) for i in range(width)], fontsize=7)
        ax_t.set_xlabel("logical block (number in the box = physical block)", fontsize=8)
        ax_t.set_title("block tables", fontsize=9, loc="left")
        for spine in ax_t.spines.values():
            spine.set_visible(False)
        for b in range(num_blocks):
            x, y = b % cols, b // cols
            who = owners.get(b, [])
            fc = "white" if not who else colour[who[0]] if len(who) == 1 else SHARED_COLOUR
            ax_p.add_patch(_box(x, y, fc, alpha=0.9 if who else 1.0, edge="#9aa5b1"))
            label = str(b) if len(who) < 2 else f"{b}\n{'+'.join(who)}"
            ax_p.text(x + 0.45, y + 0.4, label, ha="center", va="center", fontsize=7,
                      color="white" if who else "#52606d")
        ax_p.set_xlim(-0.1, cols)
        ax_p.set_ylim(h, -0.1)
        ax_p.axis("off")
        ax_p.set_title(f"physical KV blocks ({num_blocks} x {block_size} tokens; white = free)", fontsize=9, loc="left")
    fig.suptitle(title)
    return fig


def _box(x: float, y: float, colour: str, alpha: float = 1.0, width: float = 1.0, edge: str | None = None):
    import matplotlib.patches as mpatches

    return mpatches.Rectangle((x, y), 0.9 * width, 0.8, facecolor=colour, alpha=alpha,
                              edgecolor=edge or "none", linewidth=0.8)


def plot_ttft_pairs(ttft_without: Sequence[float], ttft_with: Sequence[float], title: str,
                    labels: Sequence[str] | None = None, ax: Axes | None = None) -> Figure:
    """Time to first token of the same requests, in ms, without and with prefix caching, side by side."""
    a, b = np.asarray(ttft_without, float) * 1e3, np.asarray(ttft_with, float) * 1e3
    if ax is None:
        fig, axes = _figure((9, 3.6))
        ax = axes[0, 0]
    else:
        fig = ax.figure
    x = np.arange(len(a))
    ax.bar(x - 0.2, a, width=0.4, color="#e76f51", label="prefix caching off")
    ax.bar(x + 0.2, b, width=0.4, color="#2a9d8f", label="prefix caching on")
    ax.set_xticks(x, list(labels) if labels is not None else [f"request {i + 1}" for i in x], fontsize=8)
    ax.set_ylabel("TTFT (ms)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title)
    return fig
