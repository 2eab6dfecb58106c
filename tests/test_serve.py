"""The OpenAI-compatible server, through the real `openai` client on a free loopback port."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from course_lib import SamplingParams
from course_lib.checks import invalid
from course_lib.serve import BackgroundServer, create_app, free_port, wait_until_healthy
from course_lib.serve.bench import main as bench_main
from course_lib.serve.watch import parse_metrics

openai = pytest.importorskip("openai")
NAME = "smollm2-test"


@pytest.fixture(scope="module")
def server(llm):
    with BackgroundServer(create_app(llm, NAME)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def metric(server, name: str) -> float:
    values = parse_metrics(httpx.get(server.url + "/metrics").text)
    assert name in values, f"course_lib:{name} is not in /metrics"
    return values[name]


def test_models_health_and_metric_names(server, client):
    assert httpx.get(server.url + "/health").status_code == 200
    assert [m.id for m in client.models.list().data] == [NAME]
    text = httpx.get(server.url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "request_time_per_output_token_seconds_bucket",
                 "e2e_request_latency_seconds_bucket"):
        assert f"course_lib:{name}" in text
    assert "course_lib:time_per_output_token_seconds" not in text  # vLLM removed it; so do we


def test_completion_equals_engine_greedy(llm, client, server):
    prompt = "The capital of France is"
    want = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    counts = ("generation_tokens_total", "inter_token_latency_seconds_count",
              "request_time_per_output_token_seconds_count", "e2e_request_latency_seconds_count")
    before, *counted = [metric(server, name) for name in counts]
    got = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.outputs[0].text
    assert got.choices[0].finish_reason == "length"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(want.prompt_token_ids), 12)
    assert got.usage.total_tokens == got.usage.prompt_tokens + 12
    assert metric(server, "generation_tokens_total") == before + 12
    # ITL: one observation per gap (11); TPOT and end-to-end latency: one per request
    assert [metric(server, name) - c for name, c in zip(counts[1:], counted)] == [11, 1, 1]


def test_streaming_chat_equals_engine_chat(llm, client):
    messages = [{"role": "user", "content": "Name three colours. 用中文回答。"}]
    want = llm.chat(messages, SamplingParams(max_tokens=20, temperature=0))[0]
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.outputs[0].text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == want.outputs[0].finish_reason and not any(reasons[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.outputs[0].token_ids)
    # and the same answer without streaming
    whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=20, temperature=0)
    assert whole.choices[0].message.content == want.outputs[0].text


def test_sixteen_concurrent_streams_each_get_their_own_answer(llm, server):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(16)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    want = [o.outputs[0].text for o in llm.generate(prompts, params)]

    async def one(client, prompt):
        stream = await client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(all_at_once()) == want


def post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),  # missing
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),  # wrong type
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [10**7]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4o"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
])
def test_bad_input_gets_a_4xx_and_the_server_keeps_serving(server, client, path, body, status, param):
    r = post(server, path, body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    ok = client.completions.create(model=NAME, prompt="Hello", max_tokens=2)
    assert ok.usage.completion_tokens >= 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field,value", [("stop_token_ids", [10**7]), ("temperature", -1), ("max_tokens", 0)])
def test_a_bad_field_is_named_in_param(server, path, field, value):
    prompt = {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = post(server, path, {**prompt, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_the_field_an_engine_check_names_reaches_the_client(llm, server, monkeypatch, path):
    def refuse(prompt, params):  # a check whose message names no field the old text search knew
        raise invalid(ValueError, "SamplingParams.max_tokens", "at most 4 with this prompt", params.max_tokens)

    monkeypatch.setattr(llm.engine, "check_request", refuse)
    prompt = {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = post(server, path, {**prompt, "max_tokens": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_prompt_longer_than_the_context_is_a_400(llm, server):
    r = post(server, "/v1/completions", {"prompt": [1] * llm.engine.max_model_len, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "context window" in r.json()["error"]["message"]


def test_client_that_disconnects_mid_stream_frees_its_blocks(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is generating
        assert metric(server, "num_requests_running") == 1
    deadline = time.monotonic() + 10  # closed: the server notices, aborts, frees
    while (metric(server, "num_requests_running") or metric(server, "kv_cache_usage_perc")) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(server, "num_requests_running") == 0
    assert metric(server, "kv_cache_usage_perc") == 0
    assert metric(server, "num_requests_waiting") == 0


def test_client_benchmark_against_the_server(server, tmp_path, capsys):
    summary = bench_main(["--base-url", server.url, "--concurrency", "4", "--num-requests", "8",
                          "--max-tokens", "6", "--prompt-words", "12", "--json", str(tmp_path / "b.json")])
    assert summary["failed"] == 0 and summary["output_tokens"] == 8 * 6
    assert 0 < summary["ttft_p50"] <= summary["e2e_p50"] and summary["tpot_mean"] > 0
    assert "TTFT" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "b.json").read_text())["records"]) == 8


def test_bench_summary_agrees_with_the_profiling_summary():
    """Client-side records are summarised with the same arithmetic as the engine's `RequestMetrics`."""
    from course_lib.profiling import RequestMetrics, summarize
    from course_lib.serve.bench import ClientRecord
    from course_lib.serve.bench import summarize as bench_summarize

    timestamps = [(0.0, [0.5, 0.6, 0.8]), (0.1, [1.0, 1.5]), (0.2, [0.9])]  # (sent, chunk times); one chunk = one token
    records = [ClientRecord(sent=s, chunk_times=c, prompt_tokens=7, output_tokens=len(c)) for s, c in timestamps]
    records.append(ClientRecord(sent=0.3, error="ReadTimeout: timed out"))  # counted, left out of the numbers
    metrics = []
    for s, chunks in timestamps:
        m = RequestMetrics(arrival_time=s, num_prompt_tokens=7)
        for t in chunks:
            m.record_token(t)
        m.record_finished(chunks[-1])
        metrics.append(m)
    got, want = bench_summarize(records, 2.0, ps=(50, 95)), summarize(metrics, 2.0, ps=(50, 95))
    assert (got["requests"], got["failed"]) == (4, 1)
    for key in ("output_tokens", "output_throughput", "request_throughput"):
        assert got[key] == pytest.approx(want[key])
    for mine, theirs in [("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2e_latency")]:
        for stat in ("mean", "p50", "p95"):
            assert got[f"{mine}_{stat}"] == pytest.approx(want[f"{theirs}_{stat}"]), (mine, stat)


def test_watcher_and_plots_of_a_concurrency_sweep(server):
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from course_lib.serve.bench import benchmark
    from course_lib.serve.watch import MetricsWatcher
    from course_lib.viz.serving import plot_concurrency_sweep, plot_metrics_timeline

    rows = []
    with MetricsWatcher(server.url, interval=0.05) as watch:
        for c in (1, 3):
            summary, records = benchmark(server.url, concurrency=c, num_requests=3, max_tokens=4, prompt_words=8)
            assert summary["failed"] == 0 and len(records) == 3
            rows.append({"concurrency": c, **summary})
    frame = watch.frame()
    assert len(frame) >= 2 and frame.num_requests_running.max() >= 1
    assert frame.generation_tokens_total.is_monotonic_increasing
    assert plot_concurrency_sweep(pd.DataFrame(rows).set_index("concurrency")).axes
    assert plot_metrics_timeline(frame).axes
    text = 'course_lib:num_requests_running{model_name="m"} 2.0\n# HELP x\ncourse_lib:kv_cache_usage_perc 0.25\n'
    assert parse_metrics(text) == {"num_requests_running": 2.0, "kv_cache_usage_perc": 0.25}


def test_the_server_process_finishes_what_is_in_flight_on_sigterm_and_warns_without_a_key():
    import signal
    import subprocess
    import sys
    import threading

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "course_lib.serve", "--port", str(port), "--host", "0.0.0.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc)
        lines, started = [], threading.Event()

        def stream():
            body = {"prompt": "Once upon a time", "max_tokens": 30, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)  # while the answer is streaming
        reader.join(timeout=60)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "no API key is set" in proc.stdout.read()  # bound beyond loopback without a key: it says so
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # finished, not cut off
