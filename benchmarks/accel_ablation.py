"""What each part of `course_lib.accel`'s plan gains, in one run: the full plan against the plan less one part.

    python -m benchmarks.accel_ablation                       # float32 and bfloat16
    python -m benchmarks.accel_ablation --quick --dtypes bfloat16 --json ablation.json

For each dtype it builds this machine's plan (`plan_for("cpu", dtype)`, what `LLM(accel=True)` runs), one
variant of it for each part in `ABLATIONS` with that part turned off, and the reference (`LLM()`), loads them
all at once (`LLM(accel=plan)`, prefix caching off, steps of up to `OFFLINE_BATCHED_TOKENS`) and measures them
taking turns with `benchmarks.compare`'s rounds, so a machine whose speed drifts slows them alike: batch-1
decode tok/s after a 32-token prompt, TTFT of a 512-token prompt, output tok/s of 16 and 64 requests of 64
tokens each. The gain of a part on each row is the full plan's figure over the figure of the plan without it
(for TTFT, the variant's time over the full plan's): above 1, the part helps. A part the plan already has off
on this machine is skipped, with a note. Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform

import torch

from benchmarks.compare import OFFLINE_BATCHED_TOKENS, EngineSystem, Result, Workload, measure_systems
from course_lib import LLM
from course_lib.accel import Plan, plan_for
from course_lib.chapter import processor_name, quiet_libraries
from course_lib.dtypes import dtype_name, resolve_dtype

# part -> the plan's fields that turn it off (the first is the part; the others depend on it)
# (the C++ decode step calls the fused blocks' kernels, the C++ attention and the packed layers: without any of
# them it is off too, so "no cpp_decode" alone says what running the layers from Python costs)
ABLATIONS: dict[str, dict] = {
    "cpp_decode": dict(cpp_decode=False),
    "fused_ops": dict(fused_ops=False, cpp_decode=False),
    "panel_rows": dict(panel_rows=0),
    "attention": dict(attention="torch", cpp_decode=False),
    "packed_linears": dict(packed_linears=False, panel_rows=0, cpp_decode=False),  # panels: a packed layer's rows
    "fused_blocks": dict(fused_blocks=False, fused_ops=False, cpp_decode=False),  # the C++ ops are the blocks'
}
FULL, REFERENCE = "full plan", "reference"


def variants(plan: Plan) -> tuple[dict[str, Plan], list[str]]:
    """The full plan and, for each part of `ABLATIONS` it has on, the plan without it, by name ("no fused_ops");
    and a note for each part it has off already."""
    plans, skipped = {FULL: plan}, []
    for part, off in ABLATIONS.items():
        field, value = next(iter(off.items()))
        if getattr(plan, field) == value:
            skipped.append(f"{part}: already off in this machine's {dtype_name(plan.dtype)} plan")
        else:
            plans[f"no {part}"] = dataclasses.replace(plan, **off)
    return plans, skipped


def load(dtype: torch.dtype, plans: dict[str, Plan]) -> list[EngineSystem]:
    """The reference engine and one engine per plan, all loaded now, as compare.py's `EngineSystem`s."""
    options = dict(device="cpu", dtype=dtype, enable_prefix_caching=False,
                   max_num_batched_tokens=OFFLINE_BATCHED_TOKENS)
    systems = [EngineSystem(LLM(**options), REFERENCE)]
    for name, plan in plans.items():
        systems.append(EngineSystem(LLM(accel=plan, **options), name))
    return systems


def gains(results: list[Result]) -> list[dict]:
    """For each dtype, metric and variant: what the part it lacks earns, the full plan's figure over the variant's
    (times the other way round); the reference row is what the whole plan earns."""
    by = {(r.precision, r.system, r.metric): r for r in results}
    rows = []
    for r in results:
        full = by.get((r.precision, FULL, r.metric))
        if r.system == FULL or full is None:
            continue
        gain = r.value / full.value if r.unit == "s" else full.value / r.value
        part = "whole plan" if r.system == REFERENCE else r.system.removeprefix("no ")
        rows.append({"dtype": r.precision, "part": part, "metric": r.metric, "gain": gain})
    return rows


def print_grid(cells: dict[tuple[str, str, str], str], label: str) -> None:
    """cells[(dtype, row, metric)] as a table: a line per dtype and row, a column per metric."""
    metrics = list(dict.fromkeys(m for _, _, m in cells))
    head = f"{'dtype':<10}{label:<20}" + "".join(f"{m:>24}" for m in metrics)
    print(head + "\n" + "-" * len(head))
    for dtype, row in dict.fromkeys((d, r) for d, r, _ in cells):
        print(f"{dtype:<10}{row:<20}" + "".join(f"{cells.get((dtype, row, m), '—'):>24}" for m in metrics))


def print_figures(results: list[Result]) -> None:
    """Each variant's figures, a line each."""
    print_grid({(r.precision, r.system, r.metric): f"{r.value * 1e3:.0f} ms" if r.unit == "s" else f"{r.value:.1f}"
                for r in results}, "variant")


def print_gains(rows: list[dict]) -> None:
    """Each part's gains, a line each."""
    print_grid({(r["dtype"], r["part"], r["metric"]): f"{r['gain']:.2f}x" for r in rows}, "part")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated float dtypes")
    ap.add_argument("--quick", action="store_true", help="small sizes: decode 16, prompt 128, 4 requests of 16")
    ap.add_argument("--repeats", type=int, default=None,
                    help="measured rounds after the warm-up one (TTFT: three times as many); default 3, --quick 1")
    ap.add_argument("--json", default=None, help="write the plans, every figure and every gain to this file")
    args = ap.parse_args(argv)
    quiet_libraries()
    if args.quick:
        work = Workload(decode_tokens=16, prompt_tokens=128, concurrency=(4,), uniform_output=16, repeats=1,
                        ttft_repeats=1, output_kinds=("uniform",))
    else:
        work = Workload(output_kinds=("uniform",))
    if args.repeats is not None:
        work = dataclasses.replace(work, repeats=args.repeats, ttft_repeats=3 * args.repeats)
    device = torch.device("cpu")
    print(f"{processor_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}")

    results: list[Result] = []
    report = {"plans": {}, "skipped": []}
    for dtype in map(resolve_dtype, args.dtypes.split(",")):
        name = dtype_name(dtype)
        plan = plan_for(device, dtype)
        print(f"\n{name}: this machine's plan\n{plan.describe()}")
        plans, skipped = variants(plan)
        for note in skipped:
            print(f"  skipped {note}")
        report["plans"][name] = {n: dataclasses.asdict(p) for n, p in plans.items()}
        report["skipped"] += [f"{name} {note}" for note in skipped]
        systems = load(dtype, plans)
        print(f"{name}: measuring {', '.join(s.name for s in systems)}, taking turns ...", flush=True)
        tok, config = systems[0].llm.tokenizer, systems[0].model.config
        measured = measure_systems(systems, name, work, tok, config, None, 0)  # no ceilings: no roofline fractions
        print_figures(measured)
        results += measured
        del systems
        gc.collect()

    rows = gains(results)
    if len(report["plans"]) > 1:
        print("\nall figures")
        print_figures(results)
    print("\nfull plan / plan without the part (above 1: the part helps; whole plan: full plan / reference)")
    print_gains(rows)
    if args.json:
        info = {"processor": processor_name(device), "machine": platform.machine(),
                "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
                "workload": dataclasses.asdict(work), "engine_max_num_batched_tokens": OFFLINE_BATCHED_TOKENS}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"info": info, **report, "results": [dataclasses.asdict(r) for r in results], "gains": rows},
                      f, indent=1, default=str)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
