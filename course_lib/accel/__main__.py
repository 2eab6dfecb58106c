"""`python -m course_lib.accel [build] [--device D] [--dtype T] [--compile-decode]`

Prints what `LLM(accel=True)` runs on this machine, building the C++ kernels first if needed. With `build`, builds
them and measures the panels' row limits ahead of time (what install.py, behind `make setup`, calls), so that the
first `LLM(accel=True)` does neither; a failed build is a warning and exit status 0, never a failed set-up.
"""
from __future__ import annotations

import argparse
import warnings

from .build import build, build_directory
from .plan import plan_for


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m course_lib.accel", description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", choices=["plan", "build"], default="plan")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: the device's)")
    ap.add_argument("--compile-decode", action="store_true", help="the plan with compile_decode=True")
    args = ap.parse_args()
    warnings.simplefilter("default")
    if args.command == "build":
        built = build()
        if built.module is None:
            print(f"course_lib.accel: C++ kernels not built ({built.problem}); accel=True will use PyTorch for them")
            return
        plans = {dtype: plan_for("cpu", dtype) for dtype in ("float32", "bfloat16")}
        print(f"course_lib.accel: C++ kernels built in {build_directory()}; panels up to "
              + ", ".join(f"{plan.panel_rows} rows in {dtype}" for dtype, plan in plans.items())
              + f"; W4A8 INT4 kernel up to {plans['bfloat16'].w4a8_rows} rows")
        return
    for dtype in [args.dtype] if args.dtype else ["float32", "bfloat16"]:
        plan = plan_for(args.device, dtype, compile_decode=args.compile_decode)
        print(f"LLM(accel=True) on this machine, {dtype}:")
        print(plan.describe())
        print()


if __name__ == "__main__":
    main()
