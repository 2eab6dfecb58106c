"""`MetricsWatcher`: scrape a server's Prometheus /metrics every so often, as a dashboard would.

    with MetricsWatcher(url, interval=0.1) as watch:
        benchmark(url, concurrency=8)
    frame = watch.frame()   # one row per scrape: t, num_requests_running, kv_cache_usage_perc, ...
"""
from __future__ import annotations

import threading
import time

import httpx
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

WATCHED = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "generation_tokens_total",
           "prompt_tokens_total")


def parse_metrics(text: str, prefix: str = "course_lib:") -> dict[str, float]:
    """{name without prefix: value} of every sample named with `prefix` (the first series of a labelled metric),
    read by prometheus_client's own parser of the text format."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                values.setdefault(sample.name.removeprefix(prefix), sample.value)
    return values


class MetricsWatcher:
    """A thread that scrapes `base_url`/metrics every `interval` seconds until stopped."""

    def __init__(self, base_url: str, interval: float = 0.1, names: tuple[str, ...] = WATCHED):
        self.url, self.interval, self.names = base_url.rstrip("/") + "/metrics", interval, names
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                values = parse_metrics(client.get(self.url).text)
                self.rows.append({"t": time.perf_counter() - t0, **{n: values.get(n) for n in self.names}})
                self._stop.wait(self.interval)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def __enter__(self) -> "MetricsWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
