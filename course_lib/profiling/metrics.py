"""What a serving team watches, computed from timestamps.

A request's life: it arrives, waits in the queue, is first scheduled (its prefill starts),
emits its first token, then one token per decode step, and finishes.

    arrival ──queue_time──► first_scheduled ──► first_token ──► token ──► ... ──► finished
       └─────────────── TTFT ─────────────────────┘  └─ ITL ─┘
       └──────────────────────────── e2e_latency ─────────────────────────────────┘

TTFT (time to first token, 首字延迟) is queueing plus prefill; TPOT (time per output token)
is the mean gap between tokens after the first, i.e. the decode speed. `RequestMetrics` (defined in
`course_lib.engine.metrics`, filled live by the engine) holds one request's timestamps; `summarize`
and `metrics_frame` turn many of them into numbers.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ..engine.metrics import RequestMetrics

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("queue_time", "ttft", "tpot", "itl", "e2e_latency")


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
    columns = list(_row(RequestMetrics()))
    frame = pd.DataFrame([_row(r) for r in requests], columns=columns)
    latencies = ["queue_time", "ttft", "tpot", "itl_mean", "e2e_latency"]
    frame[latencies] = frame[latencies].astype(float)
    return frame


def _row(r: RequestMetrics) -> dict[str, float | int | str | None]:
    """One flat row: ids, token counts and the scalar latencies (ITL as its mean)."""
    itl = r.itl
    return {"request_id": r.request_id, "prompt_tokens": r.num_prompt_tokens, "output_tokens": r.num_output_tokens,
            "queue_time": r.queue_time, "ttft": r.ttft, "tpot": r.tpot,
            "itl_mean": float(np.mean(itl)) if itl else None, "e2e_latency": r.e2e_latency,
            "acceptance_rate": r.acceptance_rate, "mean_accepted_length": r.mean_accepted_length}


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


def describe(values: Iterable[float | None], ps: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """{"mean": ..., "p50": ..., "p90": ..., "p99": ...} of the values, `None`s dropped (NaN when none are left)."""
    xs = [v for v in values if v is not None]
    return {"mean": float(np.mean(xs)) if xs else float("nan"), **percentiles(xs, ps)}


def _latency_stats(requests: Sequence[RequestMetrics], ps: Sequence[float]) -> dict[str, dict[str, float]]:
    return {metric: describe(_values(requests, metric), ps) for metric in LATENCY_METRICS}


def summary_frame(requests: Sequence[RequestMetrics], ps: Sequence[float] = PERCENTILES) -> pd.DataFrame:
    """Latency table in seconds: one row per metric (queue_time, ttft, tpot, itl, e2e_latency), columns mean, p50, p90, p99."""
    return pd.DataFrame.from_dict(_latency_stats(requests, ps), orient="index")
