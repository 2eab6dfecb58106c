"""Load test on a tiny random-weight model: every request finishes, concurrency is capped, arrivals are respected."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_lib.config import ModelConfig
from course_lib.engine.llm_engine import EngineConfig, LLMEngine
from course_lib.model import Transformer
from course_lib.profiling.loadtest import (SWEEP_COLUMNS, fit_line, poisson_arrivals, run_load_test,
                                           single_request_latency, sweep_concurrency, synthetic_prompt_ids,
                                           synthetic_requests)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny ops on a busy machine: one thread is faster and steadier than several that get descheduled."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model():
    """Random weights, the default tokenizer's vocabulary, two small layers."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True, name="tiny")
    return Transformer(cfg).eval()


@pytest.fixture
def engine(tiny_model, tokenizer):
    return LLMEngine(tiny_model, tokenizer, EngineConfig(kv_cache_memory=8 * 2**20))


def assert_engine_empty(engine):
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.block_manager.num_used_blocks == 0


def test_synthetic_prompts_are_exact_deterministic_and_distinct(tokenizer):
    reqs = synthetic_requests(tokenizer, 6, (40, 90), output_tokens=5, seed=3)
    assert reqs == synthetic_requests(tokenizer, 6, (40, 90), output_tokens=5, seed=3)
    assert all(40 <= len(r.prompt_token_ids) <= 90 and r.max_tokens == 5 for r in reqs)
    assert len({r.prompt_token_ids for r in reqs}) == 6
    ids = synthetic_prompt_ids(tokenizer, 200, tag=7)
    assert len(ids) == 200
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n") and "Request 7:" in text
    with pytest.raises(ValueError, match="chat template"):
        synthetic_prompt_ids(tokenizer, 10)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_fixed_concurrency_finishes_all_and_caps_batch(engine, tokenizer, concurrency):
    reqs = synthetic_requests(tokenizer, 7, (35, 70), output_tokens=6, seed=1)
    result = run_load_test(engine, reqs, concurrency=concurrency)
    frame, s = result.frame, result.summary
    assert len(frame) == 7 and (frame["finished_tokens"] == 6).all() and (frame["output_tokens"] == 6).all()
    assert max(result.batch_sizes) == concurrency  # reached the cap ...
    assert all(b <= concurrency for b in result.batch_sizes)  # ... and never went past it
    assert s["requests"] == 7 and s["output_tokens"] == 7 * 6
    assert s["input_tokens"] == sum(len(r.prompt_token_ids) for r in reqs) == frame["prompt_tokens"].sum()
    assert s["output_throughput"] == pytest.approx(42 / s["duration"])
    assert s["threads"] == torch.get_num_threads()
    for key in ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "itl_p99", "e2e_latency_p90", "queue_time_p50"):
        assert np.isfinite(s[key]) and s[key] >= 0
    assert (frame["ttft"] <= frame["e2e_latency"]).all()
    if concurrency == 1:  # one at a time: nobody waits behind another request
        assert s["queue_time_p99"] < s["ttft_p50"]
    assert_engine_empty(engine)


def test_fixed_concurrency_refills_as_requests_finish(engine, tokenizer):
    """A closed loop: the 3rd request arrives when the 1st finishes (concurrency 2, equal lengths)."""
    reqs = synthetic_requests(tokenizer, 4, 50, output_tokens=4, seed=2)
    result = run_load_test(engine, reqs, concurrency=2)
    m = result.metrics
    assert m[2].arrival_time >= min(m[0].finished_time, m[1].finished_time)
    assert m[1].arrival_time < m[0].finished_time


def test_poisson_arrivals_are_seeded_with_the_right_mean():
    a = poisson_arrivals(2000, rate=10.0, seed=0)
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert np.mean(np.diff(a)) == pytest.approx(0.1, rel=0.1)
    assert np.array_equal(a, poisson_arrivals(2000, 10.0, seed=0))
    assert not np.any(poisson_arrivals(5, float("inf")))
    with pytest.raises(ValueError):
        poisson_arrivals(5, 0.0)


@pytest.mark.parametrize("realtime", [True, False])
def test_arrival_rate_respects_arrival_times(engine, tokenizer, realtime):
    reqs = synthetic_requests(tokenizer, 8, (35, 60), output_tokens=3, seed=4)
    result = run_load_test(engine, reqs, request_rate=40.0, realtime=realtime, seed=1)
    m, frame = result.metrics, result.frame
    assert all(x.first_scheduled_time >= x.arrival_time for x in m)
    assert all(x.first_token_time >= x.first_scheduled_time for x in m)
    assert (frame["output_tokens"] == 3).all() and result.summary["output_tokens"] == 24
    gaps = np.diff(frame["arrival"])
    expected = np.diff(poisson_arrivals(8, 40.0, seed=1))
    if realtime:  # arrivals keep the Poisson schedule
        assert np.allclose(gaps, expected, atol=1e-9)
        assert result.summary["duration"] >= expected.sum()
    else:  # idle time is skipped: gaps only shrink
        assert np.all(gaps <= expected + 1e-9)
    assert_engine_empty(engine)


def test_load_test_rejects_bad_modes(engine, tokenizer):
    reqs = synthetic_requests(tokenizer, 1, 40, 2)
    with pytest.raises(ValueError, match="exactly one"):
        run_load_test(engine, reqs)
    with pytest.raises(ValueError, match="exactly one"):
        run_load_test(engine, reqs, concurrency=2, request_rate=1.0)
    with pytest.raises(ValueError, match="concurrency"):
        run_load_test(engine, reqs, concurrency=0)


def test_errors_leave_the_engine_empty(engine, tokenizer):
    reqs = synthetic_requests(tokenizer, 3, 40, 4)
    too_long = synthetic_requests(tokenizer, 1, engine.max_model_len + 5, 1)
    with pytest.raises(ValueError, match="context window"):
        run_load_test(engine, reqs + too_long, concurrency=4)
    assert_engine_empty(engine)


def test_sweep_rows_and_latency_table(engine):
    sweep = sweep_concurrency(engine, levels=(1, 2, 4), prompt_tokens=40, output_tokens=3)
    assert list(sweep["concurrency"]) == [1, 2, 4] and list(sweep.columns[:len(SWEEP_COLUMNS)]) == list(SWEEP_COLUMNS)
    assert list(sweep["requests"]) == [4, 4, 8]
    assert list(sweep["max_batch_size"]) == [1, 2, 4]
    assert (sweep["output_throughput"] > 0).all()
    lat = single_request_latency(engine, [40, 80], output_tokens=3, repeats=2)
    assert list(lat["prompt_tokens"]) == [40, 80, 40, 80] and lat["ttft"].gt(0).all() and lat["tpot"].gt(0).all()
    assert_engine_empty(engine)


def test_fit_line_and_plots():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from course_lib.profiling.plots import (plot_latency_vs_length, plot_throughput_vs_concurrency,
                                            plot_throughput_vs_latency)

    assert fit_line([1, 2, 3], [3, 5, 7]) == pytest.approx((2.0, 1.0))
    ax = plot_latency_vs_length([32, 64, 128], [0.01, 0.02, 0.04])
    assert "µs/token" in ax.get_legend().get_texts()[1].get_text()  # 0.3 ms per token shown in µs
    sweep = pd.DataFrame({"concurrency": [1, 2, 4], "output_throughput": [10.0, 18.0, 30.0],
                          "tpot_p50": [0.1, 0.11, 0.13], "ttft_p90": [0.2, 0.3, 0.5]})
    ax = plot_throughput_vs_concurrency(sweep)
    assert ax.get_ylabel() == "output throughput (tokens/s)" and len(ax.get_legend().get_texts()) == 3
    ax = plot_throughput_vs_latency(sweep)
    assert ax.get_xlabel() == "p50 TPOT per request (ms)"
    plt.close("all")
