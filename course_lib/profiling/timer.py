"""Wall-clock timing that is right on both devices.

On the CPU a call is done when it returns, so `time.perf_counter` around it is enough.
On a GPU a call only *queues* kernels and returns at once: timing it with the CPU clock
measures the launch, not the work. CUDA events are recorded into the stream before and
after the work and read after a synchronize, so they time what the GPU actually did.
Either way, the first calls pay one-off costs (allocator growth, kernel autotuning, lazy
init), so `measure` runs a few warm-up calls first and reports the median over repeats.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..dtypes import resolve_device


@dataclass
class Timing:
    """Seconds per call over `len(all)` repeats: median and the 10th/90th percentiles as spread."""

    median: float
    p10: float
    p90: float
    all: list[float] = field(repr=False)

    @property
    def mean(self) -> float:
        """Mean seconds per call (pulled up by outliers; prefer the median)."""
        return statistics.fmean(self.all)

    @property
    def min(self) -> float:
        """Fastest call, in seconds."""
        return min(self.all)

    @classmethod
    def from_samples(cls, samples: list[float]) -> "Timing":
        """Summarise a list of per-call seconds."""
        if not samples:
            raise ValueError("Timing needs at least one sample")
        p10, p50, p90 = np.percentile(samples, [10, 50, 90])
        return cls(median=float(p50), p10=float(p10), p90=float(p90), all=list(samples))

    def __str__(self) -> str:
        return f"{self.median * 1e3:.3f} ms (p10 {self.p10 * 1e3:.3f}, p90 {self.p90 * 1e3:.3f}, n={len(self.all)})"


def measure(fn: Callable[[], Any], repeats: int = 10, warmup: int = 2,
            device: torch.device | str | None = None) -> Timing:
    """Call `fn()` `warmup` times untimed, then `repeats` times timed, and summarise.

    `device` is where `fn` does its work (default: "cuda" if available, else "cpu"):
    CUDA events on a GPU, `time.perf_counter` on the CPU.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    dev = resolve_device(device)
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        return Timing.from_samples(_cuda_samples(fn, repeats, dev))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return Timing.from_samples(samples)


def _cuda_samples(fn: Callable[[], Any], repeats: int, device: torch.device) -> list[float]:
    with torch.cuda.device(device):
        torch.cuda.synchronize()  # nothing queued earlier may land inside the first interval
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()  # events are only readable once the GPU has passed them
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]  # elapsed_time is in ms


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until `device` (default: "cuda" if available) has run all the work queued on it, so that a clock
    read next counts that work. On the CPU there is nothing to wait for."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Timer:
    """Context manager timing one block: `with Timer("cuda") as t: ...` then `t.seconds`."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = resolve_device(device)
        self.seconds: float = float("nan")

    def __enter__(self) -> "Timer":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self._end.record()
            torch.cuda.synchronize(self.device)
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        else:
            self.seconds = time.perf_counter() - self._t0
