"""The CPU linear kernels of `course_lib.accel` side by side in one run: F.linear, oneDNN's packed weights and
the panels (`csrc/linear.cpp`), taking turns, at 1 to 128 rows, in float32 and bfloat16.

    python -m benchmarks.linear_kernels                        # both dtypes, 1 to 128 rows
    python -m benchmarks.linear_kernels --dtypes bfloat16 --rows 1,16,64 --repeats 9

Each timing is all linear layers of the default model's architecture (SmolLM2-135M: 30 layers of fused q/k/v,
o, fused gate/up and down, and the 49152-row vocabulary head; random weights: the speed does not depend on the
values), so the weights never fit in a cache, as in a decode step. It prints the median milliseconds, the GB/s
of weights read, and the ratios of oneDNN and the panels to F.linear and of the panels to oneDNN (above 1: the
panels are faster): what `accel.plan.PANEL_ROWS` is chosen by.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from course_lib.accel.build import build
from course_lib.accel.linear import PackedLinear

# (out, in) of one layer's fused q/k/v, o, fused gate/up, down; then the vocabulary head
LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
SHAPES = LAYER * 30 + [(49152, 576)]


def as_linear(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
    linear.weight = torch.nn.Parameter(w, requires_grad=False)
    return linear


def systems_for(dtype: torch.dtype, ops) -> tuple[dict, int]:
    torch.manual_seed(0)
    weights = [(torch.randn(n, k) * 0.02).to(dtype) for n, k in SHAPES]
    systems = {"F.linear": lambda x, i: F.linear(x, weights[i])}
    onednn = [PackedLinear(as_linear(w)) for w in weights]
    systems["oneDNN packed"] = lambda x, i: onednn[i](x)
    if ops is not None and ops.panel_width.get(str(dtype).removeprefix("torch."), 0):
        panels = [ops.pack_panels(w) for w in weights]
        systems["panels"] = lambda x, i: ops.by_panels(x, panels[i])
    return systems, sum(w.nbytes for w in weights)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,24,32,48,64,96,128")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ops = build().module
    for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
        systems, nbytes = systems_for(dtype, ops)
        print(f"\n{dtype}, {torch.get_num_threads()} threads, {nbytes / 1e6:.0f} MB of weights")
        names = list(systems)
        print(f"{'rows':>5} " + " ".join(f"{name:>22}" for name in names) + "   oneDNN/F.linear"
              + ("   panels/oneDNN" if "panels" in systems else ""))
        for m in (int(r) for r in args.rows.split(",")):
            xs = {k: torch.randn(m, k).to(dtype) for k in {k for _, k in SHAPES}}
            times = {name: [] for name in names}
            for _ in range(args.repeats + 1):  # the first round warms up, then the systems take turns
                for name, f in systems.items():
                    t = time.perf_counter()
                    for i, (_, k) in enumerate(SHAPES):
                        f(xs[k], i)
                    times[name].append(time.perf_counter() - t)
            med = {name: statistics.median(v[1:]) for name, v in times.items()}
            cells = " ".join(f"{med[n] * 1e3:8.1f} ms {nbytes / med[n] / 1e9:5.1f} GB/s" for n in names)
            ratios = f"{med['F.linear'] / med['oneDNN packed']:17.2f}x"
            if "panels" in med:
                ratios += f"{med['oneDNN packed'] / med['panels']:16.2f}x"
            print(f"{m:5d} {cells}{ratios}", flush=True)


if __name__ == "__main__":
    main()
