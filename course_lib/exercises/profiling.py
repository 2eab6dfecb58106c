"""Checkers for chapter 09 (profiling): request latencies from timestamps, a percentile, throughput.

Each checker runs the learner's function on timestamps with known answers, then, when given them,
on real requests the engine served in the notebook (compared with `RequestMetrics` and `summarize`).

    check_request_latencies(request_latencies, outputs=[out])       # RequestOutputs or RequestMetrics
    check_percentile(percentile, samples=itl_seconds)
    check_output_throughput(output_throughput, runs=[result.metrics for result in results.values()])
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..profiling.metrics import RequestMetrics, percentiles, summarize
from .check import Case, run_checks


def _metrics(x: Any) -> RequestMetrics:
    """A RequestOutput's metrics, or the RequestMetrics itself."""
    return x.metrics if hasattr(x, "metrics") else x


def _close(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _request(arrival: float, tokens: Sequence[float], finished: float | None = None, prompt: int = 10,
             rid: str = "") -> RequestMetrics:
    """A finished request with these timestamps (finish at the last token unless given)."""
    m = RequestMetrics(arrival_time=arrival, num_prompt_tokens=prompt, request_id=rid)
    m.record_scheduled(arrival)
    for t in tokens:
        m.record_token(t)
    m.record_finished(tokens[-1] if finished is None else finished)
    return m


# ---- exercise 1: TTFT, ITL, TPOT and e2e from timestamps ------------------------------------------

def _latency_case(description: str, arrival: float, tokens: Sequence[float], finished: float,
                  tpot_tol: float = 0.0) -> Case:
    n, ttft, e2e = len(tokens), tokens[0] - arrival, finished - arrival
    itl = list(np.diff(tokens))
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None

    def verify(result: Any) -> None:
        assert isinstance(result, dict), f"return a dict with keys ttft, itl, tpot, e2e, got {type(result).__name__}"
        missing = {"ttft", "itl", "tpot", "e2e"} - set(result)
        assert not missing, f"the dict lacks the key(s) {sorted(missing)}"
        got = float(result["ttft"])
        assert not _close(got, tokens[0]) or _close(ttft, tokens[0]), \
            "ttft is the first token's time itself: subtract the arrival time"
        assert _close(got, ttft), f"ttft = {got:.6f} s, expected first token - arrival = {ttft:.6f} s"
        gaps = [float(g) for g in result["itl"]]
        assert len(gaps) == n - 1, (f"itl has {len(gaps)} gaps, expected {n - 1} (one between each pair of "
                                    f"consecutive tokens; the first token's wait is the TTFT, not an ITL)")
        assert all(_close(g, e, abs_=1e-9) for g, e in zip(gaps, itl)), \
            f"itl = {np.round(gaps, 6).tolist()}, expected {np.round(itl, 6).tolist()}"
        got = float(result["e2e"])
        assert _close(got, e2e), f"e2e = {got:.6f} s, expected finished - arrival = {e2e:.6f} s"
        if tpot is None:
            assert result["tpot"] is None, \
                f"with one output token TPOT is undefined: return None, got {result['tpot']!r}"
            return
        assert result["tpot"] is not None, "tpot is None but there is more than one output token"
        got = float(result["tpot"])
        if _close(got, e2e / n):
            raise AssertionError(f"tpot = e2e / tokens = {got:.6f} s counts the prefill in: TPOT leaves the first "
                                 f"token out, (e2e - ttft) / (n - 1) = {tpot:.6f} s")
        assert _close(got, tpot, abs_=tpot_tol or 1e-12), (
            f"tpot = {got:.6f} s, expected vLLM's (e2e - ttft) / (n - 1) = {tpot:.6f} s"
            + (f" (the mean ITL is {np.mean(itl):.6f} s: here the request finishes after its last token, so the two "
               f"differ)" if not _close(np.mean(itl), tpot) else ""))

    return Case(description, (arrival, list(tokens), finished), verify)


def check_request_latencies(fn: Callable[[float, list[float], float], dict], outputs: Iterable[Any] = ()) -> bool:
    """Check `fn(arrival_time, token_times, finished_time) -> {"ttft", "itl", "tpot", "e2e"}` (seconds).

    `outputs`: RequestOutputs (or RequestMetrics) the engine produced; each becomes one more case,
    compared with what `RequestMetrics` records (TPOT within 1 ms of vLLM's formula on those).
    """
    cases = [
        _latency_case("4 tokens, finish at the last token", 10.0, [10.5, 10.6, 10.8, 11.1], 11.1),
        _latency_case("a long wait before the first token (queue + prefill)", 0.0, [2.0, 2.05, 2.1, 2.15, 2.2], 2.2),
        _latency_case("the finish stamped 50 ms after the last token", 5.0, [5.2, 5.3, 5.4], 5.45),
        _latency_case("a single output token", 1.0, [1.25], 1.25),
    ]
    for i, out in enumerate(outputs):
        m = _metrics(out)
        cases.append(_latency_case(f"engine request {i}: {m.num_output_tokens} tokens, TTFT {m.ttft * 1e3:.1f} ms",
                                   m.arrival_time, list(m.token_times), m.finished_time, tpot_tol=1e-3))
    return run_checks("check_request_latencies", fn, cases)


# ---- exercise 2: a percentile --------------------------------------------------------------------

def _percentile_case(description: str, values: Sequence[float], p: float, rel: float = 1e-9) -> Case:
    expected = float(np.percentile(np.asarray(values, dtype=float), p))
    data = list(values)
    snapshot = list(values)

    def verify(result: Any) -> None:
        assert data == snapshot, "your function changed the caller's list (sort a copy: sorted(values))"
        got = float(result)
        xs = sorted(snapshot)
        nearest = xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]
        if not _close(got, expected, rel=rel) and _close(got, nearest):
            raise AssertionError(f"got {got:g}, the nearest-rank value; interpolate linearly between the two order "
                                 f"statistics around rank (n - 1) * p / 100: expected {expected:g}")
        assert _close(got, expected, rel=rel), f"p{p:g} of {len(xs)} values: got {got:g}, expected {expected:g}"

    return Case(description, (data, p), verify)


def check_percentile(fn: Callable[[Sequence[float], float], float], samples: Sequence[float] = ()) -> bool:
    """Check `fn(values, p) -> float`, the p-th percentile (0-100) with linear interpolation (numpy's
    default, as vLLM's benchmarks and `course_lib.profiling.percentiles` use). `samples`: latencies
    measured by the engine, checked at p50, p90 and p99 against `percentiles`."""
    cases = [
        _percentile_case("p50 of 5 values", [15, 20, 35, 40, 50], 50),
        _percentile_case("p40 of 5 values falls between two of them", [15, 20, 35, 40, 50], 40),
        _percentile_case("unsorted input", [0.3, 0.1, 0.2, 0.5, 0.4], 90),
        _percentile_case("p0 is the minimum", [3.0, 1.0, 2.0], 0),
        _percentile_case("p100 is the maximum", [3.0, 1.0, 2.0], 100),
        _percentile_case("one value", [7.0], 99),
        _percentile_case("p99 of 1..100", list(range(1, 101)), 99),
    ]
    samples = [float(s) for s in samples]
    if samples:
        reference = percentiles(samples, (50, 90, 99))
        for p in (50, 90, 99):
            case = _percentile_case(f"p{p} of {len(samples)} engine latencies "
                                    f"(percentiles(): {reference[f'p{p}'] * 1e3:.2f} ms)", samples, p)
            cases.append(case)
    return run_checks("check_percentile", fn, cases)


# ---- exercise 3: output throughput ---------------------------------------------------------------

def _throughput_case(description: str, requests: Sequence[RequestMetrics]) -> Case:
    requests = list(requests)
    expected = summarize(requests)["output_throughput"]
    n_out = sum(r.num_output_tokens for r in requests)
    wrong = {
        "the mean of each request's tokens / e2e (a per-request speed, not the server's)":
            float(np.mean([r.num_output_tokens / r.e2e_latency for r in requests])),
        "tokens / the sum of the e2e latencies (requests overlap: their times must not be added)":
            n_out / sum(r.e2e_latency for r in requests),
        "a window that starts at the first token instead of the first arrival":
            n_out / (max(r.finished_time for r in requests) - min(r.first_token_time for r in requests)),
    }

    def verify(result: Any) -> None:
        got = float(result)
        if not _close(got, expected, rel=1e-9):
            for mistake, value in wrong.items():
                if _close(got, value, rel=1e-9):
                    raise AssertionError(f"got {got:.3f} tokens/s: that is {mistake}; expected {expected:.3f}")
        assert _close(got, expected, rel=1e-9), (
            f"got {got:.3f} tokens/s, expected all output tokens / (last finish - first arrival) = {expected:.3f}")

    return Case(description, (requests,), verify)


def check_output_throughput(fn: Callable[[list[RequestMetrics]], float],
                            runs: Iterable[Sequence[Any]] = ()) -> bool:
    """Check `fn(requests) -> output tokens/s` of a run: every output token of every request, divided by
    the run's wall time (first arrival to last finish), as `summarize` and vLLM's benchmarks compute it.
    `runs`: lists of RequestMetrics (or RequestOutputs) from load tests, each checked against `summarize`."""
    overlap = [_request(0.0, [1.0, 2.0, 3.0], rid="a"), _request(1.0, [4.0, 4.5], rid="b"),
               _request(2.0, [4.0], rid="c")]
    staggered = [_request(0.0, [0.2, 0.3, 0.4, 0.5]), _request(0.1, [0.4, 0.5, 0.6]),
                 _request(3.0, [3.5, 3.6])]  # an idle gap between 0.6 s and 3.0 s still counts: the server waited
    cases = [
        _throughput_case("one request", [_request(0.0, [0.5, 0.6, 0.7, 0.8])]),
        _throughput_case("three overlapping requests", overlap),
        _throughput_case("requests with an idle gap between them", staggered),
    ]
    for i, run in enumerate(runs):
        metrics = [_metrics(x) for x in run]
        cases.append(_throughput_case(f"engine run {i}: {len(metrics)} requests, "
                                      f"{sum(m.num_output_tokens for m in metrics)} output tokens", metrics))
    return run_checks("check_output_throughput", fn, cases)
