"""The timer: perf_counter on the CPU, CUDA events on a GPU."""
import time

import pytest
import torch

from course_lib.profiling import Timer, Timing, measure


def test_cpu_measure_counts_calls_and_times_sleep():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.01)

    t = measure(fn, repeats=5, warmup=2, device="cpu")
    assert len(calls) == 7 and len(t.all) == 5
    assert 0.009 < t.median < 0.1
    assert t.p10 <= t.median <= t.p90 and t.min <= t.median


def test_timing_from_known_samples():
    t = Timing.from_samples([0.5, 0.1, 0.2, 0.4, 0.3])
    assert t.median == pytest.approx(0.3)
    assert t.p10 == pytest.approx(0.14) and t.p90 == pytest.approx(0.46)
    assert t.mean == pytest.approx(0.3)
    assert "300.000 ms" in str(t)
    with pytest.raises(ValueError):
        Timing.from_samples([])
    with pytest.raises(ValueError):
        measure(lambda: None, repeats=0, device="cpu")


def test_cpu_timer_context():
    with Timer("cpu") as t:
        time.sleep(0.01)
    assert 0.009 < t.seconds < 0.1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_events_time_the_gpu_work():
    a = torch.randn(4096, 4096, device="cuda")
    t = measure(lambda: a @ a, repeats=5, warmup=2, device="cuda")
    flops = 2 * 4096 ** 3 / t.median
    assert 1e11 < flops < 1e16  # a real GPU matmul rate: the events waited for the kernel
    with Timer("cuda") as timer:
        a @ a
    assert timer.seconds > 0
