"""What a serving team watches, computed from timestamps.

A request's life: it arrives, waits in the queue, is first scheduled (its prefill starts),
emits its first token, then one token per decode step, and finishes.

    arrival ──queue_time──► first_scheduled ──► first_token ──► token ──► ... ──► finished
       └─────────────── TTFT ─────────────────────┘  └─ ITL ─┘
       └──────────────────────────── e2e_latency ─────────────────────────────────┘

TTFT (time to first token, 首字延迟) is queueing plus prefill; TPOT (time per output token)
is the mean gap between tokens after the first, i.e. the decode speed. `RequestMetrics` is
filled live by the engine; `summarize` and `metrics_frame` turn many of them into numbers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("queue_time", "ttft", "tpot", "itl", "e2e_latency")


@dataclass
class RequestMetrics:
    """Timestamps of one request, in seconds on one clock (`time.perf_counter` by default).

    The `record_*` methods stamp an event now, or at an explicit `t` (tests, replayed logs).
    Derived latencies are `None` until the events they need have happened.
    """

    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0
    request_id: str = ""

    def record_scheduled(self, t: float | None = None) -> None:
        """Mark that the request was scheduled; only the first call counts (preemption reschedules)."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = time.perf_counter() if t is None else t

    def record_token(self, t: float | None = None) -> None:
        """Mark that one output token was produced; the first one also sets `first_token_time`."""
        t = time.perf_counter() if t is None else t
        self.token_times.append(t)
        if self.first_token_time is None:
            self.first_token_time = t

    def record_finished(self, t: float | None = None) -> None:
        """Mark the request as done (stop token, length limit or abort)."""
        self.finished_time = time.perf_counter() if t is None else t

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_times)

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to first being scheduled."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Time to first token: seconds from arrival to the first output token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive output tokens, in seconds."""
        return np.diff(self.token_times).tolist()

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (last - first token time) / (tokens - 1), the mean ITL.

        vLLM writes it (e2e - TTFT) / (tokens - 1); the two agree when the finish is stamped with the
        last token, as the engine does (they differ by microseconds: the last token's detokenization).
        """
        n = len(self.token_times)
        return None if n < 2 else (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def e2e_latency(self) -> float | None:
        """Seconds from arrival to finish."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    def as_dict(self) -> dict[str, float | int | str | None]:
        """One flat row: ids, token counts and the scalar latencies (ITL as its mean)."""
        itl = self.itl
        return {
            "request_id": self.request_id,
            "prompt_tokens": self.num_prompt_tokens,
            "output_tokens": self.num_output_tokens,
            "queue_time": self.queue_time,
            "ttft": self.ttft,
            "tpot": self.tpot,
            "itl_mean": float(np.mean(itl)) if itl else None,
            "e2e_latency": self.e2e_latency,
        }


def percentiles(values: Iterable[float | None], ps: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} of the values, `None`s dropped (NaN when none are left).

    Linear interpolation between order statistics (numpy's default), as vLLM's benchmarks use.
    """
    xs = np.array([v for v in values if v is not None], dtype=float)
    if xs.size == 0:
        return {f"p{p:g}": float("nan") for p in ps}
    return {f"p{p:g}": float(v) for p, v in zip(ps, np.percentile(xs, ps))}


def metrics_frame(requests: Sequence[RequestMetrics]) -> pd.DataFrame:
    """A tidy table: one row per request, one column per metric (seconds), missing values as NaN."""
    columns = list(RequestMetrics().as_dict())
    frame = pd.DataFrame([r.as_dict() for r in requests], columns=columns)
    latencies = ["queue_time", "ttft", "tpot", "itl_mean", "e2e_latency"]
    frame[latencies] = frame[latencies].astype(float)
    return frame


def _values(requests: Sequence[RequestMetrics], metric: str) -> list[float | None]:
    if metric == "itl":  # every gap of every request counts once, as in vLLM's benchmark_serving
        return [gap for r in requests for gap in r.itl]
    return [getattr(r, metric) for r in requests]


def summarize(requests: Sequence[RequestMetrics], duration: float | None = None,
              ps: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """Run-level numbers: counts, throughput (tokens/s) and mean + percentiles of each latency.

    `duration` defaults to first arrival -> last finish. Keys: "requests", "duration",
    "input_tokens", "output_tokens", "input_throughput", "output_throughput",
    "request_throughput", then "<metric>_mean" and "<metric>_p50" ... for queue_time, ttft,
    tpot, itl and e2e_latency.
    """
    if not requests:
        raise ValueError("summarize needs at least one request")
    if duration is None:
        ends = [r.finished_time for r in requests if r.finished_time is not None]
        if not ends:
            raise ValueError("no request has finished; pass duration= explicitly")
        duration = max(ends) - min(r.arrival_time for r in requests)
    if duration <= 0:
        raise ValueError(f"duration must be > 0, got {duration}")
    n_in = sum(r.num_prompt_tokens for r in requests)
    n_out = sum(r.num_output_tokens for r in requests)
    out: dict[str, float] = {
        "requests": len(requests), "duration": duration,
        "input_tokens": n_in, "output_tokens": n_out,
        "input_throughput": n_in / duration, "output_throughput": n_out / duration,
        "request_throughput": len(requests) / duration,
    }
    for metric, stats in _latency_stats(requests, ps).items():
        out.update({f"{metric}_{k}": v for k, v in stats.items()})
    return out


def _latency_stats(requests: Sequence[RequestMetrics], ps: Sequence[float]) -> dict[str, dict[str, float]]:
    stats = {}
    for metric in LATENCY_METRICS:
        vals = [v for v in _values(requests, metric) if v is not None]
        stats[metric] = {"mean": float(np.mean(vals)) if vals else float("nan"), **percentiles(vals, ps)}
    return stats


def summary_frame(requests: Sequence[RequestMetrics], ps: Sequence[float] = PERCENTILES) -> pd.DataFrame:
    """Latency table in seconds: one row per metric (queue_time, ttft, tpot, itl, e2e_latency), columns mean, p50, p90, p99."""
    return pd.DataFrame.from_dict(_latency_stats(requests, ps), orient="index")
