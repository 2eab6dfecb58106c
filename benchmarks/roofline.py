"""Measure this machine's roofline and place a prefill and a decode step of the default model on it.

    python -m benchmarks.roofline                 # default model, its device, figures/roofline.png
    python -m benchmarks.roofline --random        # random weights of the SmolLM2-135M shape (no download)

Prints both measured ceilings, each step's counted FLOPs and bytes, its arithmetic intensity,
achieved FLOP/s and fraction of the roof above it, and checks that the prefill's intensity
is at least 50x the decode step's ("compute decides TTFT, bandwidth decides output speed").
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from course_lib.config import ModelConfig
from course_lib.dtypes import resolve_device_dtype
from course_lib.model import Transformer
from course_lib.profiling import measure_ceilings, measure_decode, measure_prefill
from course_lib.profiling.plots import plot_roofline

SMOLLM2_135M = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                           num_kv_heads=3, head_dim=64, tie_word_embeddings=True, rope_theta=100000.0,
                           name="SmolLM2-135M shape, random weights")


def load(random: bool, device: torch.device, dtype: torch.dtype) -> tuple[Transformer, str]:
    """The default model, or a random one of its shape when asked or when loading fails (with a warning)."""
    if not random:
        try:
            from course_lib import load_model

            return load_model(device=device, dtype=dtype).eval(), "default model (SmolLM2-135M-Instruct)"
        except Exception as e:
            warnings.warn(f"could not load the default model ({e!r}); using random weights of its shape")
    torch.manual_seed(0)
    return Transformer(SMOLLM2_135M).to(device=device, dtype=dtype).eval(), SMOLLM2_135M.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--context", type=int, default=512, help="cached tokens before the decode step")
    ap.add_argument("--random", action="store_true", help="random weights instead of the default model")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    ap.add_argument("--out", default="figures/roofline.png")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    device, dtype = resolve_device_dtype(args.device, args.dtype)
    model, label = load(args.random, device, dtype)
    print(f"model: {label}, {model.config.num_parameters() / 1e6:.1f} M parameters, {device} {dtype}, "
          f"{torch.get_num_threads()} CPU threads")

    ceilings = measure_ceilings(device, dtype)
    print(f"ceilings: matmul {ceilings.peak_flops / 1e9:.1f} GFLOP/s, copy bandwidth {ceilings.bandwidth / 1e9:.2f} GB/s,"
          f" ridge point {ceilings.ridge_point:.1f} FLOP/byte")

    prefill = measure_prefill(model, args.prefill_tokens, repeats=3, warmup=1)
    decode = measure_decode(model, args.context, repeats=10, warmup=2)
    print(f"{'step':<22}{'GFLOP':>9}{'MB moved':>10}{'FLOP/B':>9}{'ms':>10}{'GFLOP/s':>10}{'GB/s':>8}"
          f"{'roof GFLOP/s':>14}{'of roof':>9}  bound")
    for p in (prefill, decode):
        roof = ceilings.attainable(p.intensity)
        print(f"{p.name:<22}{p.cost.flops / 1e9:>9.2f}{p.cost.bytes / 1e6:>10.1f}{p.intensity:>9.1f}"
              f"{p.seconds * 1e3:>10.1f}{p.achieved_flops / 1e9:>10.1f}{p.achieved_bandwidth / 1e9:>8.2f}"
              f"{roof / 1e9:>14.1f}{p.fraction_of_roof(ceilings):>9.0%}  {p.bound(ceilings)}")

    ratio = prefill.intensity / decode.intensity
    print(f"arithmetic intensity: prefill {prefill.intensity:.1f}, decode {decode.intensity:.2f} FLOP/byte, "
          f"ratio {ratio:.0f}x ({'ok' if ratio >= 50 else 'FAILED'}: needs >= 50x)")
    print(f"prefill: {args.prefill_tokens / prefill.seconds:.0f} tokens/s; "
          f"decode: {1 / decode.seconds:.1f} tokens/s at batch 1")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ax = plot_roofline(ceilings, [prefill, decode],
                       title=f"Roofline on this machine: {label.split(' (')[0]}, {device.type} {ceilings.dtype}")
    ax.figure.tight_layout()
    ax.figure.savefig(out, dpi=120)
    plt.close(ax.figure)
    print(f"saved {out}")
    return 0 if ratio >= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
