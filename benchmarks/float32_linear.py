"""float32 linear layers on the CPU, side by side in one run: F.linear, MKL's packed GEMM, the panel kernel
for a few rows (both from `course_lib/sgemm_packed_cpu.cpp`) and oneDNN's packed weights (`PackedLinear`, which
the engine takes on CPUs not made by Intel, with the panels for up to `ONEDNN_PANEL_ROWS` rows), taking turns.

    python -m benchmarks.float32_linear                      # 1 to 128 rows
    python -m benchmarks.float32_linear --rows 1,16,64 --repeats 9

Each timing is all linear layers of the default model's architecture (SmolLM2-135M: 30 layers of fused q/k/v,
o, fused gate/up and down, and the 49152-row vocabulary head; 538 MB of float32, random weights: the speed does
not depend on the values), so the weights never fit in a cache, as in a decode step. It prints the median
milliseconds, the GB/s of weights read, and the panels' ratio to MKL's packed GEMM and to oneDNN (above 1: the
panels are faster). These are the figures `sgemm_packed_cpu.cpp` and `onednn_linear_cpu.cpp` quote, and the
panels' row limits are chosen by.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from course_lib.packed_linear import ONEDNN_PANEL_ROWS, PackedLinear, has_panel_kernel, sgemm_kernel

# (out, in) of one layer's fused q/k/v, o, fused gate/up, down; then the vocabulary head
LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
SHAPES = LAYER * 30 + [(49152, 576)]


def as_linear(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight = torch.nn.Parameter(w, requires_grad=False)
    return linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,24,32,48,64,128")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not has_panel_kernel():
        raise SystemExit("needs the MKL kernel built with AVX-512 (sgemm_packed_cpu.cpp); this machine has not")
    kernel = sgemm_kernel()
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for n, k in SHAPES]
    packed = [kernel.pack(w) for w in weights]
    panels = [kernel.pack_panels(w) for w in weights]
    nbytes = sum(w.nbytes for w in weights)
    systems = {
        "F.linear": lambda x, i: F.linear(x, weights[i]),
        "MKL packed": lambda x, i: kernel.linear(x, packed[i], None, SHAPES[i][0]),
        "panels": lambda x, i: kernel.by_panels(x, panels[i]),  # at any rows, to show where MKL takes over
    }
    if torch.backends.mkldnn.is_available():
        onednn = [PackedLinear(as_linear(w)) for w in weights]  # oneDNN alone: no panels
        systems["oneDNN packed"] = lambda x, i: onednn[i](x)
    print(f"{torch.get_num_threads()} threads, {nbytes / 1e6:.0f} MB of weights; on an Intel CPU the engine sends "
          f"up to {kernel.panel_rows} rows to the panels and more to MKL, elsewhere up to {ONEDNN_PANEL_ROWS} rows "
          "to the panels and more to oneDNN")
    has_onednn = "oneDNN packed" in systems
    print(f"{'rows':>5} " + " ".join(f"{name:>20}" for name in systems) + "   panels / MKL"
          + ("   panels / oneDNN" if has_onednn else ""))
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k) for k in {k for _, k in SHAPES}}
        times = {name: [] for name in systems}
        for _ in range(args.repeats + 1):  # the first round warms up, then the systems take turns
            for name, f in systems.items():
                t = time.perf_counter()
                for i, (_, k) in enumerate(SHAPES):
                    f(xs[k], i)
                times[name].append(time.perf_counter() - t)
        med = {name: statistics.median(v[1:]) for name, v in times.items()}
        cells = " ".join(f"{med[n] * 1e3:7.1f} ms {nbytes / med[n] / 1e9:5.1f} GB/s" for n in systems)
        versus = f"{med['MKL packed'] / med['panels']:13.2f}x"
        if has_onednn:
            versus += f"{med['oneDNN packed'] / med['panels']:17.2f}x"
        print(f"{m:5d} {cells}{versus}", flush=True)


if __name__ == "__main__":
    main()
