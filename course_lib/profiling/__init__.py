"""Measuring inference: timers, request metrics, memory accounting, FLOP counts, the roofline, torch.profiler.

    timer          measure(fn) -> Timing: CUDA events on a GPU, perf_counter on the CPU
    metrics        summarize, metrics_frame of the engine's RequestMetrics (TTFT, TPOT, ITL, e2e); describe
    memory         weight_bytes, kv_cache_bytes, kv_cache_report, memory_breakdown, process_memory
    flops          step_cost / prefill_cost / decode_cost: FLOPs, bytes and intensity of a step
    roofline       measure_ceilings, measure_prefill, measure_decode, RooflinePoint, prefill_tokens_for_intensity
    loadtest       run_load_test (fixed concurrency or Poisson arrivals), sweep_concurrency, single_request_latency
    plots          plot_roofline, plot_latency_vs_length, plot_throughput_vs_concurrency, plot_throughput_vs_latency
    torch_profile  profile_steps: top operators of a prefill and a decode step; phase_summary: time by operator family
"""
from .flops import StepCost, decode_cost, prefill_cost, step_bytes, step_cost, step_flops
from .memory import (activation_bytes, as_model_config, breakdown_frame, kv_bytes_per_token, kv_cache_bytes,
                     kv_cache_report, memory_breakdown, process_memory, weight_bytes)
from .loadtest import (LoadRequest, LoadTestResult, fit_line, poisson_arrivals, run_load_test,
                       single_request_latency, sweep_concurrency, synthetic_requests)
from .metrics import RequestMetrics, describe, metrics_frame, percentiles, summarize, summary_frame
from .roofline import (Ceilings, RooflinePoint, measure_bandwidth, measure_ceilings, measure_decode,
                       measure_matmul_flops, measure_prefill, prefill_tokens_for_intensity)
from .timer import Timer, Timing, measure

__all__ = [
    "StepCost", "step_cost", "step_flops", "step_bytes", "prefill_cost", "decode_cost",
    "activation_bytes", "as_model_config", "breakdown_frame", "kv_bytes_per_token", "kv_cache_bytes",
    "kv_cache_report", "memory_breakdown", "process_memory", "weight_bytes",
    "LoadRequest", "LoadTestResult", "fit_line", "poisson_arrivals", "run_load_test", "single_request_latency",
    "sweep_concurrency", "synthetic_requests",
    "RequestMetrics", "describe", "metrics_frame", "percentiles", "summarize", "summary_frame",
    "Ceilings", "RooflinePoint", "measure_bandwidth", "measure_ceilings", "measure_decode",
    "measure_matmul_flops", "measure_prefill", "prefill_tokens_for_intensity",
    "Timer", "Timing", "measure",
]
