"""Prometheus metrics of the server, with vLLM's names under a `course_lib:` prefix.

    course_lib:num_requests_running        gauge      requests in the running batch
    course_lib:num_requests_waiting        gauge      requests queued for a first step
    course_lib:kv_cache_usage_perc         gauge      share of KV blocks held by requests, 0 to 1
    course_lib:prompt_tokens_total         counter    prompt tokens of requests that were served
    course_lib:generation_tokens_total     counter    tokens generated
    course_lib:time_to_first_token_seconds histogram  arrival to first token (TTFT, 首字延迟)
    course_lib:inter_token_latency_seconds histogram  every gap between a request's consecutive tokens (ITL)
    course_lib:request_time_per_output_token_seconds histogram  one per finished request:
                                                      (last token - first token) / (tokens - 1) (TPOT)
    course_lib:e2e_request_latency_seconds histogram  arrival to finish, one per finished request
    course_lib:request_success_total       counter    finished requests, by finish_reason
    course_lib:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total
                                           counters   speculative decoding: verifications, drafted tokens,
                                                      accepted tokens (of finished requests); acceptance rate =
                                                      accepted / drafted, mean accepted length = 1 + accepted / drafts

ITL and TPOT differ in what one observation is: a slow step shows in the ITL histogram as one long gap
per request it delayed, while in TPOT it is averaged into each request's mean. vLLM removed its older
`time_per_output_token_seconds` (an ITL under a misleading name) for these two.

Each server has its own registry, so tests can start several in one process.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine.sequence import RequestOutput
from .async_engine import AsyncEngine

PREFIX = "course_lib:"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                   20.0, 40.0)


class ServerMetrics:
    """The server's counters; gauges are read from the engine when /metrics is scraped."""

    def __init__(self, engine: AsyncEngine, model: str):
        self.registry = registry = CollectorRegistry()
        labels = dict(labelnames=["model_name"], registry=registry)
        Gauge(f"{PREFIX}num_requests_running", "Requests in the running batch.", **labels) \
            .labels(model).set_function(lambda: engine.num_running)
        Gauge(f"{PREFIX}num_requests_waiting", "Requests waiting for their first step.", **labels) \
            .labels(model).set_function(lambda: engine.num_waiting)
        Gauge(f"{PREFIX}kv_cache_usage_perc", "Share of KV cache blocks in use (1 = full).", **labels) \
            .labels(model).set_function(lambda: engine.kv_cache_usage)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens served.", **labels).labels(model)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens", "Tokens generated.", **labels).labels(model)
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds", "Time to first token.",
                              buckets=LATENCY_BUCKETS, **labels).labels(model)
        self.itl = Histogram(f"{PREFIX}inter_token_latency_seconds", "Gaps between a request's consecutive tokens.",
                             buckets=LATENCY_BUCKETS, **labels).labels(model)
        self.tpot = Histogram(f"{PREFIX}request_time_per_output_token_seconds",
                              "Each finished request's mean time per output token after the first.",
                              buckets=LATENCY_BUCKETS, **labels).labels(model)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds", "Arrival to finish of each request.",
                             buckets=LATENCY_BUCKETS, **labels).labels(model)
        self._success = Counter(f"{PREFIX}request_success", "Finished requests.",
                                labelnames=["model_name", "finished_reason"], registry=registry)
        self.spec = {name: Counter(f"{PREFIX}spec_decode_{name}", help_, **labels).labels(model) for name, help_ in (
            ("num_drafts", "Speculative steps that verified drafted tokens."),
            ("num_draft_tokens", "Tokens drafted."), ("num_accepted_tokens", "Drafted tokens the model accepted."))}
        self.model = model

    def observe(self, out: RequestOutput, tokens_before: int) -> int:
        """Count what `out` adds to its request (given the tokens counted before); returns its token count."""
        tokens = len(out.outputs[0].token_ids)
        if tokens_before == 0 and tokens > 0:
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            if out.metrics.ttft is not None:
                self.ttft.observe(out.metrics.ttft)
        self.generation_tokens.inc(tokens - tokens_before)
        times = out.metrics.token_times
        for i in range(max(tokens_before, 1), min(tokens, len(times))):
            self.itl.observe(times[i] - times[i - 1])
        if out.finished:
            if out.metrics.tpot is not None:
                self.tpot.observe(out.metrics.tpot)
            if out.metrics.e2e_latency is not None:
                self.e2e.observe(out.metrics.e2e_latency)
            self._success.labels(self.model, out.outputs[0].finish_reason or "abort").inc()
            for name, counter in self.spec.items():
                counter.inc(getattr(out.metrics, name))
        return tokens

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
