"""`python -m course_lib.planner`: print a deployment plan as a table.

    python -m course_lib.planner --model llama-3-70b --device h100 --format q4_k_m --context 8192 --users 16
    python -m course_lib.planner --model llama-3-8b --device l4 --format awq
    python -m course_lib.planner --model path/to/config.json --device "this machine" --dtype float32
    python -m course_lib.planner --list

Names are case-insensitive and forgiving ("h100", "a100-80gb", "4090", "qwen2.5-7b", "Q4_K_M", "awq"); an unknown
one lists the choices. --format names a real checkpoint format; --weight-bits the course engine's own QuantLinear.
--device "this machine" measures this machine's ceilings first (a few seconds).
"""
from __future__ import annotations

import argparse
import sys

from .devices import DEVICES, THIS_MACHINE, find_device
from .estimate import FRACTIONS, GPU_FRACTIONS, MEMORY_UTILIZATION, plan
from .formats import FORMATS
from .presets import DEFAULT_MODEL, PRESETS, load_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_lib.planner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a preset name, a config.json, a model directory or a .gguf")
    ap.add_argument("--device", default="H100 SXM", help=f"a device name, or {THIS_MACHINE!r} to measure this one")
    ap.add_argument("--dtype", default=None, help="bfloat16, float16 or float32 (default: the device's own)")
    ap.add_argument("--format", default=None, help=f"a weight format: {', '.join(FORMATS)} (see --list)")
    ap.add_argument("--weight-bits", type=int, default=None, choices=[8, 4],
                    help="the course engine's own INT8/INT4 QuantLinear layout instead of --format")
    ap.add_argument("--group-size", type=int, default=32, help="INT4 weights per scale (default 32; INT8 has one a row)")
    ap.add_argument("--context", type=int, default=4096, help="tokens each user holds (prompt + answer)")
    ap.add_argument("--users", type=int, default=1, help="concurrent users (requests decoding together)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens for TTFT (default: --context)")
    for i, flag in enumerate(("bandwidth", "prefill-flops", "decode-flops")):
        ap.add_argument(f"--{flag}-fraction", type=float, default=None,
                        help=f"share of the ceiling the engine reaches (default: GPUs {GPU_FRACTIONS[i]}, published; "
                             f"CPUs measured for their maker, Intel {FRACTIONS['GenuineIntel'][i]})")
    ap.add_argument("--memory-utilization", type=float, default=MEMORY_UTILIZATION)
    ap.add_argument("--list", action="store_true", help="list the preset models, devices and formats, then exit")
    args = ap.parse_args(argv)
    if args.list:
        print("models:  " + ", ".join(PRESETS))
        print("devices: " + ", ".join([*DEVICES, THIS_MACHINE]))
        for spec in DEVICES.values():
            print(f"  {spec.name:<13} {spec.source}")
        print("formats (bits a weight: linear layers / embeddings / lm_head):")
        for f in FORMATS.values():
            print(f"  {f.name:<9} {f.bits_per_weight:.3g} / {f.embedding_bits:.3g} / {f.head_bits:.3g}   runs on: "
                  f"{f.needs}\n            source: {f.source}")
        return 0
    try:
        config, device = load_config(args.model), find_device(args.device)
        result = plan(config, device, dtype=args.dtype, weight_bits=args.weight_bits, weight_format=args.format,
                      context_len=args.context, concurrency=args.users, prompt_len=args.prompt,
                      group_size=args.group_size, bandwidth_fraction=args.bandwidth_fraction,
                      prefill_flops_fraction=args.prefill_flops_fraction,
                      decode_flops_fraction=args.decode_flops_fraction, memory_utilization=args.memory_utilization)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.table())
    print(f"\ndevice figures: {device.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
