"""Harness for notebook 07 (batching and scheduling): interleaved best-of-n runs and the static/continuous picture.

    best = best_of_interleaved({"static": run_static, "continuous": run_continuous}, repeats=3)
    seconds, result = best["static"]          # the fastest static run and what it returned
    fig = plot_schedule_pair(lengths, static_grid, continuous_grid, batch_size=4)
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .scheduling import plot_state_grid

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def best_of_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 3,
                        key: Callable[[Any], float] | None = None) -> dict[str, tuple[float, Any]]:
    """Run every function once per round, `repeats` rounds, and keep each one's best run as (seconds, result).

    "Best" is the shortest wall-clock time, or the smallest `key(result)` when `key` is given. Interleaving the
    functions means a hiccup of a shared machine (or a first-run cost) spoils one run of one function only.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    tries: dict[str, list[tuple[float, Any]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            result = fn()
            tries[name].append((time.perf_counter() - start, result))
    score = (lambda t: t[0]) if key is None else (lambda t: key(t[1]))
    return {name: min(runs, key=score) for name, runs in tries.items()}


def plot_schedule_pair(lengths: Sequence[int], static_grid: Sequence[Sequence[str]],
                       continuous_grid: Sequence[Sequence[str]], batch_size: int) -> Figure:
    """Draw a static and a continuous schedule of the same requests one above the other, on one step scale."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(13, 8.5))
    rows = [f"{i} ({n} tok)" for i, n in enumerate(lengths)]
    plot_state_grid(rows, static_grid, ax=axes[0],
                    title=f"Static batching by hand, B = {batch_size}: each batch waits for its longest request")
    plot_state_grid(rows, continuous_grid, ax=axes[1],
                    title=f"Continuous batching by hand, {batch_size} seats: a free seat is refilled at once")
    axes[1].set_xlim(axes[0].get_xlim())  # the same scale: the shorter grid is the faster schedule
    fig.tight_layout()
    return fig
