"""Deployment planner (部署规划): can this model run on that card, how fast will it type, how many users fit?

    from course_lib.planner import plan, DEVICES, PRESETS, DeviceSpec
    p = plan("llama-3-70b", "h100", weight_bits=4, context_len=8192, concurrency=16)
    print(p)                      # the table: each figure with the formula it came from
    p.fits, p.max_concurrency, p.ttft_s, p.tpot_s
    plan(llm.model.config, DeviceSpec.measure(), dtype="float32")  # this machine, its ceilings measured now

    python -m course_lib.planner --model llama-3-70b --device h100 --weight-bits 4 --context 8192 --users 16

    presets    PRESETS (config.json sizes of well-known models), load_config (a name, dict, config.json or .gguf)
    devices    DeviceSpec (memory, bandwidth, FLOP/s per dtype, source), DEVICES (datasheets), DeviceSpec.measure()
    estimate   plan -> Plan: weights, KV cache, activations, fits, max users, TTFT, TPOT, tokens/s
    validate   the plan against the engine on this machine (predicted vs measured), calibrate
"""
from .devices import DEVICES, THIS_MACHINE, DeviceSpec, find_device
from .estimate import (BANDWIDTH_FRACTION, DECODE_FLOPS_FRACTION, FRACTIONS, MEMORY_UTILIZATION,
                       PREFILL_FLOPS_FRACTION, Fractions, Plan, WeightMemory, default_fractions, plan, weight_memory)
from .presets import DEFAULT_MODEL, PRESETS, load_config

__all__ = ["DEVICES", "THIS_MACHINE", "DeviceSpec", "find_device", "BANDWIDTH_FRACTION", "PREFILL_FLOPS_FRACTION",
           "DECODE_FLOPS_FRACTION", "FRACTIONS", "Fractions", "default_fractions", "MEMORY_UTILIZATION", "Plan",
           "WeightMemory", "plan", "weight_memory",
           "DEFAULT_MODEL", "PRESETS", "load_config"]
