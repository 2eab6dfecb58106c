"""Deployment planner (部署规划): can this model run on that card, how fast will it type, how many users fit?

    from course_lib.planner import plan, DEVICES, PRESETS, DeviceSpec
    p = plan("llama-3-70b", "h100", weight_format="q4_k_m", context_len=8192, concurrency=16)
    print(p)                      # the table: each figure with the formula it came from, and the fractions' source
    p.fits, p.max_concurrency, p.ttft_s, p.tpot_s
    plan(llm.model.config, DeviceSpec.measure(), dtype="float32")  # this machine, its ceilings measured now

    plan("llama-3-8b", "l4", weight_format="awq")                  # formats: FORMATS (q4_k_m, q8_0, awq, fp8, ...)
    plan("llama-3-8b", "l4", weight_bits=4)   # the course engine's own INT4 QuantLinear (~6 bits a weight)

    python -m course_lib.planner --model llama-3-70b --device h100 --format q4_k_m --context 8192 --users 16

    presets    PRESETS (config.json sizes of well-known models), load_config (a name, dict, config.json or .gguf)
    devices    DeviceSpec (memory, bandwidth, FLOP/s per dtype, source), DEVICES (datasheets), DeviceSpec.measure()
    formats    WeightFormat (bits a weight per kind of layer, what runs it, source), FORMATS, find_format;
               file_bits (bits a parameter over a whole file), LLAMA_31_8B_FILES (llama.cpp's published files)
    estimate   plan -> DeploymentPlan: weights, KV cache, activations, fits, max users, TTFT, TPOT, tokens/s
    multi_gpu  split_plan, devices_needed: the same plan over tp devices (tensor parallelism, chapter 13)
    validate   the plan against the engine on this machine (predicted vs measured), calibrate
"""
from .devices import DEVICES, THIS_MACHINE, DeviceSpec, find_device
from .estimate import (BANDWIDTH_FRACTION, DECODE_FLOPS_FRACTION, FRACTIONS, GPU_FRACTIONS, MEMORY_UTILIZATION,
                       PREFILL_FLOPS_FRACTION, DeploymentPlan, Fractions, WeightMemory, default_fractions, file_bits,
                       plan, weight_memory)
from .formats import FORMATS, LLAMA_31_8B_FILES, WeightFormat, find_format
from .multi_gpu import SplitPlan, devices_needed, split_plan, valid_tp_sizes
from .presets import DEFAULT_MODEL, PRESETS, load_config

__all__ = ["DEVICES", "THIS_MACHINE", "DeviceSpec", "find_device", "BANDWIDTH_FRACTION", "PREFILL_FLOPS_FRACTION",
           "DECODE_FLOPS_FRACTION", "FRACTIONS", "GPU_FRACTIONS", "Fractions", "default_fractions",
           "MEMORY_UTILIZATION", "DeploymentPlan", "WeightMemory", "plan", "weight_memory", "file_bits",
           "FORMATS", "LLAMA_31_8B_FILES", "WeightFormat", "find_format",
           "DEFAULT_MODEL", "PRESETS", "load_config",
           "SplitPlan", "devices_needed", "split_plan", "valid_tp_sizes"]
