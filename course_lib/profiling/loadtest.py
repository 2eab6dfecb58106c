"""Load testing the serving engine in-process: many requests, their latencies, the run's throughput.

Two ways to offer load, as serving benchmarks do (vLLM's `benchmark_serving`):

    closed loop, fixed concurrency C:  C requests in flight; each one that finishes is replaced at once
    open loop, arrival rate r:         requests arrive at Poisson times (mean gap 1/r seconds), whether
                                       or not the engine keeps up; before each `step()` every request whose
                                       arrival time has passed is added, stamped with that arrival time

Each request is a deterministic synthetic chat prompt with a fixed output length (greedy, EOS ignored),
so every run does the same work. `run_load_test` returns `summarize(...)` of the requests' metrics
(p50/p90/p99 TTFT, TPOT, ITL, e2e, queue time; input/output tokens/s) and a per-request table;
`sweep_concurrency` repeats it for growing C: throughput rises while each request's latency grows.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
import torch

from ..sampling import SamplingParams
from .metrics import RequestMetrics, metrics_frame, summarize

if TYPE_CHECKING:
    from ..engine.llm_engine import LLMEngine
    from ..tokenizer import Tokenizer

TOPICS = ("the KV cache", "paged attention", "tokenization", "quantization", "memory bandwidth",
          "continuous batching", "rotary position embeddings", "sampling with temperature", "prefill",
          "the decode loop", "speculative decoding", "prefix caching")
SWEEP_COLUMNS = ("concurrency", "requests", "duration", "output_throughput", "input_throughput",
                 "request_throughput", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "itl_p50",
                 "e2e_latency_p50", "queue_time_p50", "mean_batch_size", "max_batch_size", "preemptions")


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load test: prompt token ids and the exact number of tokens to generate."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int

    @property
    def params(self) -> SamplingParams:
        """Greedy, EOS ignored: the request produces exactly `max_tokens` tokens."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=0.0, ignore_eos=True)


def synthetic_prompt_ids(tokenizer: Tokenizer, num_tokens: int, tag: int = 0) -> list[int]:
    """A chat prompt of exactly `num_tokens` ids: the template around a user message cut to fit.

    The message starts with `tag`, so prompts with different tags share no KV block past the
    system prompt (the prefix cache cannot serve one request's prompt to another).
    """
    marker = "\x00"
    head, tail = (tokenizer.encode(part, add_bos=False)
                  for part in tokenizer.apply_chat_template([{"role": "user", "content": marker}]).split(marker))
    room = num_tokens - len(head) - len(tail)
    if room < 1:
        raise ValueError(f"num_tokens must be > {len(head) + len(tail)} (the chat template alone), got {num_tokens}")
    rng = np.random.default_rng(tag)
    words = [f"Request {tag}:"]
    body: list[int] = []
    while len(body) < room:
        for _ in range(max(1, (room - len(body)) // 10)):  # a sentence is about 10 tokens
            a, b = rng.integers(len(TOPICS), size=2)
            words.append(f"explain {TOPICS[a]} and how it relates to {TOPICS[b]}.")
        body = tokenizer.encode(" ".join(words), add_bos=False)
    return head + body[:room] + tail


def synthetic_requests(tokenizer: Tokenizer, num_requests: int, prompt_tokens: int | tuple[int, int] = 64,
                       output_tokens: int = 16, seed: int = 0) -> list[LoadRequest]:
    """`num_requests` distinct chat prompts of `prompt_tokens` tokens (or drawn from [lo, hi]), `output_tokens` each."""
    if num_requests < 1 or output_tokens < 1:
        raise ValueError(f"need num_requests >= 1 and output_tokens >= 1, got {num_requests}, {output_tokens}")
    rng = np.random.default_rng(seed)
    lo, hi = (prompt_tokens, prompt_tokens) if isinstance(prompt_tokens, int) else prompt_tokens
    lengths = rng.integers(lo, hi + 1, size=num_requests)
    return [LoadRequest(tuple(synthetic_prompt_ids(tokenizer, int(n), tag=seed * 100_000 + i)), output_tokens)
            for i, n in enumerate(lengths)]


def poisson_arrivals(num_requests: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival offsets in seconds: the first at 0, then exponential gaps of mean 1/rate (all at 0 if rate is inf)."""
    if rate <= 0:
        raise ValueError(f"request_rate must be > 0, got {rate}")
    if np.isinf(rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=num_requests)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


@dataclass
class LoadTestResult:
    """What one load test measured: the summary, one row per request, and the engine's batches during the run."""

    mode: str
    summary: dict[str, float]
    frame: pd.DataFrame
    metrics: list[RequestMetrics] = field(repr=False)
    batch_sizes: list[int] = field(repr=False)

    def __str__(self) -> str:
        s = self.summary
        return (f"{self.mode}: {s['requests']:.0f} requests in {s['duration']:.2f} s, "
                f"{s['output_throughput']:.1f} output tok/s, TTFT p50 {s['ttft_p50'] * 1e3:.0f} ms "
                f"p90 {s['ttft_p90'] * 1e3:.0f} ms, TPOT p50 {s['tpot_p50'] * 1e3:.0f} ms, "
                f"mean batch {s['mean_batch_size']:.1f} ({s['threads']:.0f} threads)")


def run_load_test(engine: LLMEngine, requests: Sequence[LoadRequest], concurrency: int | None = None,
                  request_rate: float | None = None, realtime: bool = True, seed: int = 0) -> LoadTestResult:
    """Serve `requests` through `engine` with a fixed `concurrency` or a Poisson `request_rate` (req/s).

    Exactly one of the two must be given. With a rate and `realtime=False`, time when the engine
    has nothing to do is skipped (later arrivals move earlier by the idle gap) instead of slept.
    On any error every request still in flight is aborted, so the engine is left empty.
    """
    if (concurrency is None) == (request_rate is None):
        raise ValueError("give exactly one of concurrency= and request_rate=")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not requests:
        raise ValueError("run_load_test needs at least one request")
    offsets = poisson_arrivals(len(requests), request_rate, seed) if request_rate is not None else None
    first_step = len(engine.stats.batch_sizes)
    queue = deque(range(len(requests)))
    in_flight: dict[str, int] = {}  # request id -> index into requests
    done: dict[int, RequestMetrics] = {}
    produced: dict[int, int] = {}
    t0 = time.perf_counter()
    skipped = 0.0  # idle seconds skipped when not realtime

    def add(i: int, arrival: float) -> None:
        r = requests[i]
        in_flight[engine.add_request(list(r.prompt_token_ids), r.params, arrival_time=arrival)] = i

    try:
        while queue or in_flight:
            now = time.perf_counter()
            if offsets is None:
                while queue and len(in_flight) < concurrency:
                    add(queue.popleft(), now)
            else:
                due = t0 + offsets[queue[0]] - skipped if queue else now
                if not in_flight and due > now:  # idle until the next arrival
                    if realtime:
                        time.sleep(due - now)
                    else:
                        skipped += due - now
                    now = time.perf_counter()
                while queue and t0 + offsets[queue[0]] - skipped <= now:
                    i = queue.popleft()
                    add(i, t0 + offsets[i] - skipped)
            for out in engine.step():
                if out.finished and out.request_id in in_flight:
                    i = in_flight.pop(out.request_id)
                    done[i], produced[i] = out.metrics, len(out.outputs[0].token_ids)
    except BaseException:
        for rid in in_flight:
            engine.abort_request(rid)
        raise
    metrics = [done[i] for i in range(len(requests))]
    batch_sizes = engine.stats.batch_sizes[first_step:]
    frame = metrics_frame(metrics)
    frame.insert(1, "arrival", [m.arrival_time - t0 for m in metrics])
    frame.insert(4, "max_tokens", [r.max_tokens for r in requests])
    frame["finished_tokens"] = [produced[i] for i in range(len(requests))]
    summary = summarize(metrics)
    summary.update(mean_batch_size=float(np.mean(batch_sizes)) if batch_sizes else 0.0,
                   max_batch_size=float(max(batch_sizes, default=0)), steps=float(len(batch_sizes)),
                   preemptions=float(engine.stats.preemptions), threads=float(torch.get_num_threads()))
    mode = f"concurrency {concurrency}" if offsets is None else f"rate {request_rate:g} req/s"
    return LoadTestResult(mode, summary, frame, metrics, batch_sizes)


def warm_up(engine: LLMEngine, prompt_tokens: int = 64, output_tokens: int = 4) -> None:
    """Run one throwaway request: the first steps pay one-off costs (allocation, lazy initialisation)."""
    reqs = synthetic_requests(engine.tokenizer, 1, prompt_tokens, output_tokens, seed=9_999)
    run_load_test(engine, reqs, concurrency=1)


def sweep_concurrency(engine: LLMEngine, levels: Sequence[int] = (1, 2, 4, 8, 16),
                      prompt_tokens: int | tuple[int, int] = 64, output_tokens: int = 16,
                      requests_per_level: int | None = None, min_requests: int = 4, seed: int = 0,
                      verbose: bool = False) -> pd.DataFrame:
    """Throughput against latency as concurrency grows: one closed-loop load test per level.

    Level C serves `requests_per_level` requests (default max(min_requests, 2 C)), with prompts no
    other level shares (so the prefix cache cannot carry work between levels). One row per level,
    columns `SWEEP_COLUMNS` (seconds, tokens/s).
    """
    warm_up(engine)
    rows = []
    for k, c in enumerate(levels):
        n = requests_per_level or max(min_requests, 2 * c)
        reqs = synthetic_requests(engine.tokenizer, n, prompt_tokens, output_tokens,
                                  seed=2_000_000 + seed * 1000 + k)
        result = run_load_test(engine, reqs, concurrency=c)
        if verbose:
            print(result)
        rows.append({"concurrency": c, **result.summary})
    frame = pd.DataFrame(rows)
    return frame[list(SWEEP_COLUMNS) + ["threads"]]


def single_request_latency(engine: LLMEngine, prompt_lengths: Sequence[int], output_tokens: int = 8,
                           repeats: int = 1, seed: int = 0) -> pd.DataFrame:
    """TTFT and TPOT of lone requests (concurrency 1) of each prompt length, each new prompt unseen by the prefix cache.

    TTFT is then one prefill of the prompt (plus the step's overheads); TPOT is the decode time per
    token at a context of about the prompt's length. Returns one row per request: prompt_tokens,
    ttft, tpot, e2e_latency, repeat. A prompt longer than the engine's `max_num_batched_tokens` is
    prefilled in chunks, over several steps.
    """
    warm_up(engine)
    rows = []
    for r in range(repeats):
        for j, n in enumerate(prompt_lengths):
            req = synthetic_requests(engine.tokenizer, 1, int(n), output_tokens,
                                     seed=1_000_000 + seed * 1000 + r * 100 + j)
            m = run_load_test(engine, req, concurrency=1).metrics[0]
            rows.append({"prompt_tokens": int(n), "ttft": m.ttft, "tpot": m.tpot, "e2e_latency": m.e2e_latency,
                         "repeat": r})
    return pd.DataFrame(rows)


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of y = slope * x + intercept."""
    slope, intercept = np.polyfit(np.asarray(x, dtype=float), np.asarray(y, dtype=float), 1)
    return float(slope), float(intercept)
