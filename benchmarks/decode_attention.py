"""Decode attention over the paged KV cache on the CPU, per call: the C++ kernel against the PyTorch reference.

    python -m benchmarks.decode_attention                        # 1, 16 and 64 sequences, float32 and bfloat16
    python -m benchmarks.decode_attention --seqs 64 --dtypes float32 --hot

The default model's attention (SmolLM2-135M: 9 query heads on 3 KV heads of 64, blocks of 16 tokens), one layer:
each sequence has a context drawn from --context and its blocks scattered over the cache, as in an engine that has
run a while. Before every call 32 MB of other memory is written, because in a decode step the layer's weights
stream through the caches between two attention calls (--hot leaves it out). The kernel
(`course_lib.accel.build.build().module.paged_decode_attention`, `csrc/attention.cpp`) and the reference
(`course_lib.attention.paged.paged_decode_attention`: a gather into a padded tensor, then a masked SDPA) take turns
in every round, so a machine whose speed drifts slows both alike. It prints the median microseconds a call, the
ratio, and the GB/s of K/V each reads (a sequence's own tokens only: the reference's padding and its gathered copy
are not counted) beside this machine's copy bandwidth: a kernel near that bandwidth is memory-bound and only fewer
bytes (a smaller cache dtype) would make it faster; far below it, its instructions are the limit. (The copy figure
counts read + write; a write also reads its line first, so a kernel that only reads can show more than 100%.) The
history of these figures is in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from benchmarks.compare import rounds
from course_lib.accel.build import build
from course_lib.attention.paged import paged_decode_attention
from course_lib.dtypes import dtype_name
from course_lib.profiling.roofline import measure_bandwidth
from tests.paged_inputs import random_decode_batch

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16  # SmolLM2-135M
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # max |kernel - reference|, outputs ~1


@dataclass
class Row:
    dtype: str
    seqs: int
    tokens: int  # cached tokens of all sequences together
    kernel_us: float
    reference_us: float
    kernel_gb_s: float
    reference_gb_s: float


class Attention:
    """One way to run decode attention, named for `rounds`; `measure` times one call."""

    def __init__(self, name: str, fn, inputs: tuple, flush: torch.Tensor | None):
        self.name, self.fn, self.inputs, self.flush = name, fn, inputs, flush

    def measure(self) -> float:
        if self.flush is not None:
            self.flush.add_(1.0)  # evict K/V from the caches, as a layer's weights would
        t = time.perf_counter()
        self.fn(*self.inputs)
        return time.perf_counter() - t


def decode_kernel() -> Callable:
    """The C++ decode attention kernel, as this benchmark times it (a test swaps in a wrong one here)."""
    return build().module.paged_decode_attention


def decode_inputs(seqs: int, context: tuple[int, int], dtype: torch.dtype, seed: int = 0) -> tuple:
    """q, k_cache, v_cache, block_tables, context_lens for `seqs` sequences of `context` tokens; blocks shuffled."""
    lens = torch.randint(context[0], context[1] + 1, (seqs,), generator=torch.Generator().manual_seed(seed))
    return random_decode_batch(lens.tolist(), HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, spare_blocks=64, seed=seed)


def measure(seqs: int, dtype: torch.dtype, context: tuple[int, int], repeats: int, hot: bool) -> Row:
    inputs = decode_inputs(seqs, context, dtype)
    k, lens = inputs[1], inputs[-1]
    kernel = decode_kernel()
    diff = (kernel(*inputs).float() - paged_decode_attention(*inputs).float()).abs().max()
    if diff > TOLERANCE[dtype]:
        raise SystemExit(f"{seqs} sequences, {dtype}: kernel and reference differ by {diff:.2e}")
    flush = None if hot else torch.empty(2 ** 23)  # 32 MB
    systems = [Attention("kernel", kernel, inputs, flush),
               Attention("reference", paged_decode_attention, inputs, flush)]
    times = {name: statistics.median(t) for name, t in rounds(systems, Attention.measure, repeats).items()}
    kv_bytes = 2 * int(lens.sum()) * KV_HEADS * HEAD_DIM * k.element_size()  # K and V of every cached token
    return Row(dtype_name(dtype), seqs, int(lens.sum()), times["kernel"] * 1e6,
               times["reference"] * 1e6, kv_bytes / times["kernel"] / 1e9, kv_bytes / times["reference"] / 1e9)


def dtype_list(text: str) -> list[torch.dtype]:
    """--dtypes: names of the dtypes this benchmark has a tolerance for."""
    known = {dtype_name(d): d for d in TOLERANCE}
    if not set(text.split(",")) <= set(known):
        raise argparse.ArgumentTypeError(f"each of {', '.join(known)}; got {text}")
    return [known[name] for name in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="1,16,64")
    ap.add_argument("--dtypes", type=dtype_list, default="float32,bfloat16",
                    help=f"comma-separated, of {', '.join(map(dtype_name, TOLERANCE))}")
    ap.add_argument("--context", default="90,190", help="lowest,highest cached tokens of a sequence")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--hot", action="store_true", help="K/V left in the caches between calls")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    if build().module is None:
        raise SystemExit(f"the C++ kernels could not be built here: {build().problem}")
    lo, hi = map(int, args.context.split(","))
    bandwidth = measure_bandwidth("cpu") / 1e9
    print(f"{torch.get_num_threads()} threads; copy bandwidth {bandwidth:.1f} GB/s; "
          f"{HEADS} heads on {KV_HEADS} KV heads of {HEAD_DIM}; contexts {lo}-{hi} tokens; "
          f"K/V {'hot' if args.hot else 'evicted before each call'}; median of {args.repeats} calls each")
    print(f"{'dtype':9} {'seqs':>4} {'tokens':>7} {'kernel (% of copy bandwidth)':>28} {'reference':>20} "
          f"{'kernel / reference':>19}")
    rows = []
    for dtype in args.dtypes:
        for seqs in map(int, args.seqs.split(",")):
            r = measure(seqs, dtype, (lo, hi), args.repeats, args.hot)
            rows.append(r)
            print(f"{r.dtype:9} {r.seqs:4} {r.tokens:7} {r.kernel_us:7.0f} us {r.kernel_gb_s:5.1f} GB/s "
                  f"({r.kernel_gb_s / bandwidth:4.0%}) "
                  f"{r.reference_us:7.0f} us {r.reference_gb_s:5.1f} GB/s {r.reference_us / r.kernel_us:12.2f}x faster")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"threads": torch.get_num_threads(), "copy_bandwidth_gb_s": bandwidth, "hot": args.hot,
                       "rows": [asdict(r) for r in rows]}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
