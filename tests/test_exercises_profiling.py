"""Chapter 09's checkers: True on a reference solution, False on plausible mistakes and on an untouched stub."""
import numpy as np
import pytest

from course_lib.exercises import check_output_throughput, check_percentile, check_request_latencies
from course_lib.exercises.profiling import _request


# ---- reference solutions --------------------------------------------------------------------------

def request_latencies(arrival_time, token_times, finished_time):
    ttft = token_times[0] - arrival_time
    e2e = finished_time - arrival_time
    itl = [b - a for a, b in zip(token_times, token_times[1:])]
    tpot = (e2e - ttft) / (len(token_times) - 1) if len(token_times) > 1 else None
    return {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e": e2e}


def percentile(values, p):
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    lo = int(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def output_throughput(requests):
    tokens = sum(r.num_output_tokens for r in requests)
    return tokens / (max(r.finished_time for r in requests) - min(r.arrival_time for r in requests))


def stub(*args):
    raise NotImplementedError  # your code here


# ---- plausible mistakes --------------------------------------------------------------------------

def tpot_with_prefill(arrival_time, token_times, finished_time):
    out = request_latencies(arrival_time, token_times, finished_time)
    out["tpot"] = out["e2e"] / len(token_times)
    return out


def tpot_as_mean_itl(arrival_time, token_times, finished_time):
    out = request_latencies(arrival_time, token_times, finished_time)
    out["tpot"] = float(np.mean(out["itl"])) if out["itl"] else None
    return out


def ttft_absolute(arrival_time, token_times, finished_time):
    out = request_latencies(arrival_time, token_times, finished_time)
    out["ttft"] = token_times[0]
    return out


def nearest_rank(values, p):
    xs = sorted(values)
    return xs[max(0, int(np.ceil(p / 100 * len(xs))) - 1)]


def sorts_in_place(values, p):
    values.sort()
    return percentile(values, p)


def mean_request_rate(requests):
    return float(np.mean([r.num_output_tokens / r.e2e_latency for r in requests]))


def sum_of_latencies(requests):
    return sum(r.num_output_tokens for r in requests) / sum(r.e2e_latency for r in requests)


@pytest.fixture
def engine_like_requests():
    """Timestamps shaped like an engine run: 8 requests, 16 tokens each, the finish 30 us after the last token."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(8):
        arrival = 0.1 * i
        tokens = list(arrival + 0.2 + np.cumsum(rng.uniform(0.04, 0.08, size=16)))
        out.append(_request(arrival, tokens, finished=tokens[-1] + 3e-5, prompt=64, rid=str(i)))
    return out


def test_request_latencies(engine_like_requests, capsys):
    assert check_request_latencies(request_latencies, outputs=engine_like_requests)
    assert "12/12 checks passed" in capsys.readouterr().out
    assert not check_request_latencies(tpot_with_prefill)
    assert "counts the prefill in" in capsys.readouterr().out
    assert not check_request_latencies(tpot_as_mean_itl)  # differs from vLLM's when the finish comes later
    assert not check_request_latencies(ttft_absolute)
    assert "subtract the arrival time" in capsys.readouterr().out
    assert not check_request_latencies(stub)
    assert "not attempted" in capsys.readouterr().out


def test_percentile(engine_like_requests, capsys):
    itls = [gap for r in engine_like_requests for gap in r.itl]
    assert check_percentile(percentile, samples=itls)
    assert check_percentile(lambda v, p: float(np.percentile(v, p)), samples=itls)
    assert not check_percentile(nearest_rank)
    assert "nearest-rank" in capsys.readouterr().out
    assert not check_percentile(sorts_in_place)
    assert "changed the caller's list" in capsys.readouterr().out
    assert not check_percentile(stub)
    assert "not attempted" in capsys.readouterr().out


def test_output_throughput(engine_like_requests, capsys):
    assert check_output_throughput(output_throughput, runs=[engine_like_requests, engine_like_requests[:3]])
    assert not check_output_throughput(mean_request_rate)
    assert "per-request speed" in capsys.readouterr().out
    assert not check_output_throughput(sum_of_latencies)
    assert "must not be added" in capsys.readouterr().out
    assert not check_output_throughput(stub)
    assert "not attempted" in capsys.readouterr().out
