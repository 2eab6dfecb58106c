"""Request metrics from known timestamps give known values."""
import ast
import math
from pathlib import Path

import pytest

import course_lib.engine
from course_lib.profiling import RequestMetrics, metrics_frame, percentiles, summarize, summary_frame


def _request(arrival, scheduled, tokens, prompt=10, rid=""):
    r = RequestMetrics(arrival_time=arrival, num_prompt_tokens=prompt, request_id=rid)
    r.record_scheduled(scheduled)
    for t in tokens:
        r.record_token(t)
    r.record_finished(tokens[-1])
    return r


def test_single_request():
    r = _request(arrival=1.0, scheduled=1.5, tokens=[2.0, 2.1, 2.3, 2.6])
    assert r.queue_time == pytest.approx(0.5)
    assert r.ttft == pytest.approx(1.0)
    assert r.itl == pytest.approx([0.1, 0.2, 0.3])
    assert r.tpot == pytest.approx(0.6 / 3)
    assert r.e2e_latency == pytest.approx(1.6)
    assert r.num_output_tokens == 4


def test_live_record_and_first_only_events():
    r = RequestMetrics()  # arrival stamped now, with perf_counter
    assert r.ttft is None and r.tpot is None and r.e2e_latency is None and r.queue_time is None
    r.record_scheduled()
    first = r.first_scheduled_time
    r.record_scheduled()  # a preempted request is rescheduled; the queue time keeps the first
    assert r.first_scheduled_time == first
    r.record_token()
    assert r.tpot is None and r.itl == []  # one token: no gaps yet
    r.record_token()
    r.record_finished()
    assert 0 <= r.queue_time <= r.ttft <= r.e2e_latency
    assert r.tpot == pytest.approx(r.itl[0])


def test_percentiles_known_values():
    p = percentiles(range(1, 101))  # 1..100, linear interpolation
    assert p == {"p50": pytest.approx(50.5), "p90": pytest.approx(90.1), "p99": pytest.approx(99.01)}
    assert percentiles([3.0, None, 1.0, 2.0], ps=(50,)) == {"p50": 2.0}
    assert math.isnan(percentiles([])["p50"])


def test_run_summary_and_tables():
    reqs = [
        _request(0.0, 0.0, [1.0, 2.0, 3.0], prompt=100, rid="a"),  # ttft 1, tpot 1, e2e 3
        _request(1.0, 2.0, [4.0, 4.5], prompt=50, rid="b"),  # queue 1, ttft 3, tpot 0.5, e2e 3.5
        _request(2.0, 2.0, [4.0], prompt=50, rid="c"),  # ttft 2, no tpot, e2e 2
    ]
    s = summarize(reqs)
    assert s["requests"] == 3 and s["duration"] == pytest.approx(4.5)  # first arrival 0 -> last finish 4.5
    assert s["input_tokens"] == 200 and s["output_tokens"] == 6
    assert s["input_throughput"] == pytest.approx(200 / 4.5)
    assert s["output_throughput"] == pytest.approx(6 / 4.5)
    assert s["ttft_mean"] == pytest.approx(2.0) and s["ttft_p50"] == pytest.approx(2.0)
    assert s["ttft_p90"] == pytest.approx(2.8)  # between 2 and 3, 80% of the way
    assert s["tpot_mean"] == pytest.approx(0.75)  # request c has one token: no TPOT
    assert s["itl_p50"] == pytest.approx(1.0)  # gaps pooled over requests: 1, 1, 0.5
    assert s["queue_time_p99"] == pytest.approx(0.98)
    assert summarize(reqs, duration=10.0)["output_throughput"] == pytest.approx(0.6)

    frame = metrics_frame(reqs)
    assert list(frame["request_id"]) == ["a", "b", "c"]
    assert frame["tpot"].isna().tolist() == [False, False, True]
    assert frame.loc[1, "ttft"] == pytest.approx(3.0)

    table = summary_frame(reqs)
    assert list(table.index) == ["queue_time", "ttft", "tpot", "itl", "e2e_latency"]
    assert list(table.columns) == ["mean", "p50", "p90", "p99"]
    assert table.loc["e2e_latency", "p50"] == pytest.approx(3.0)


def test_summarize_needs_finished_requests():
    with pytest.raises(ValueError, match="duration"):
        summarize([RequestMetrics(arrival_time=0.0)])


def _imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of every module `path` imports (relative ones resolved against its `package`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from .. import profiling`
    return found


def test_engine_does_not_import_profiling():
    """The engine owns `RequestMetrics`; profiling builds on the engine, never the other way round."""
    engine_dir = Path(course_lib.engine.__file__).parent
    for path in sorted(engine_dir.rglob("*.py")):
        package = ".".join(path.parent.relative_to(engine_dir.parent.parent).parts)
        bad = {m for m in _imported_modules(path, package)
               if m == "course_lib.profiling" or m.startswith("course_lib.profiling.")}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_request_metrics_is_one_class():
    import course_lib.profiling.metrics
    from course_lib.engine.metrics import RequestMetrics as EngineMetrics
    assert RequestMetrics is EngineMetrics is course_lib.profiling.metrics.RequestMetrics
