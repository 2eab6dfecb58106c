"""Measuring inference: timers, request metrics, memory accounting, FLOP counts, the roofline, torch.profiler.

    timer          measure(fn) -> Timing: CUDA events on a GPU, perf_counter on the CPU
    metrics        RequestMetrics (TTFT, TPOT, ITL, e2e, queue time), summarize, metrics_frame
    memory         weight_bytes, kv_cache_bytes, kv_cache_report, memory_breakdown, process_memory
    flops          step_cost / prefill_cost / decode_cost: FLOPs, bytes and intensity of a step
    roofline       measure_ceilings, measure_prefill, measure_decode, RooflinePoint
    plots          plot_roofline
    torch_profile  profile_steps: top operators of a prefill and a decode step
"""
from .flops import StepCost, decode_cost, prefill_cost, step_bytes, step_cost, step_flops
from .memory import (activation_bytes, as_model_config, breakdown_frame, kv_bytes_per_token, kv_cache_bytes,
                     kv_cache_report, memory_breakdown, process_memory, weight_bytes)
from .metrics import RequestMetrics, metrics_frame, percentiles, summarize, summary_frame
from .roofline import (Ceilings, RooflinePoint, measure_bandwidth, measure_ceilings, measure_decode,
                       measure_matmul_flops, measure_prefill)
from .timer import Timer, Timing, measure

__all__ = [
    "StepCost", "step_cost", "step_flops", "step_bytes", "prefill_cost", "decode_cost",
    "activation_bytes", "as_model_config", "breakdown_frame", "kv_bytes_per_token", "kv_cache_bytes",
    "kv_cache_report", "memory_breakdown", "process_memory", "weight_bytes",
    "RequestMetrics", "metrics_frame", "percentiles", "summarize", "summary_frame",
    "Ceilings", "RooflinePoint", "measure_bandwidth", "measure_ceilings", "measure_decode",
    "measure_matmul_flops", "measure_prefill",
    "Timer", "Timing", "measure",
]
