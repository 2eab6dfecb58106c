"""The planner against the engine on this machine: predicted and measured, side by side.

Three figures of a loaded `LLM`, as `benchmarks/compare.py` measures them (its 16-request figure also
counts the prefills; this one is the decode steps' rate, since prefills are TTFT's business):

    TPOT, 1 request          median gap between the tokens of one request (a 32-token prompt)
    TTFT, 512-token prompt   one request whose prompt the prefix cache has never seen
    tokens/s, 16 requests    16 requests decoding together: 16 / the median time of their shared steps

Each is measured right after `DeviceSpec.measure()` and predicted by `plan` from those ceilings: the
drifts of a shared machine (clock, other programs' memory traffic) move the ceilings and the engine
together, so predicted / measured is steadier than either; `rounds` repeats the lot, the table keeps medians.

What no ratio survives is another program holding one of the CPU's cores: a copy or a big matmul then runs
about half as fast, but the engine's many small multi-threaded ops wait at every barrier for the thread that is
not running, so a decode step slows down many times more. `core_speedup` (all threads against one, on a
matmul) tells the two cases apart; `validate` records it before and after, and `judged` leaves every figure
out below 1.5.

Nor does one when the engine's speed does not follow the copy's. On AMD EPYCs the host's memory traffic moves a
copy's speed from one second to the next, while the reference engine's batch-1 step holds still: MKL's one-row
float32 product there runs on one thread, limited by that core, not by the memory system. A round measured in a
fast spell predicts too fast (benchmarks/RESULTS.md, "The planner's AMD shares"). `validate` records the spread
of the copies it measured ("bandwidth_spread", fastest over slowest); above `STEADY_BANDWIDTH`, `judged` keeps
TTFT alone (a prefill is matmuls, the copy ~10% of it).
"""
from __future__ import annotations

import random
import statistics

import numpy as np
import pandas as pd
import torch

from ..profiling.flops import decode_cost, prefill_cost
from ..profiling.loadtest import synthetic_prompt_ids
from ..profiling.roofline import measure_matmul_flops
from ..sampling import SamplingParams
from ..dtypes import dtype_name
from .devices import DeviceSpec
from .estimate import plan, weight_memory

SHORT_PROMPT = 32  # tokens: the prompt of the decode measurements (the chat template alone is 30)
STEADY_BANDWIDTH = 1.35  # the largest fastest/slowest copy within one `validate` that the check trusts
BUSY_CORES = 1.5  # below this `core_speedup`, another program held a core during the run


def _generate(llm, prompts: list[list[int]], tokens: int):
    return llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))


def measure_tpot(llm, decode_tokens: int = 24, tag: int = 0) -> float:
    """Seconds: the median gap between the tokens of one request with a 32-token prompt."""
    out = _generate(llm, [synthetic_prompt_ids(llm.tokenizer, SHORT_PROMPT, tag)], decode_tokens)[0]
    return statistics.median(out.metrics.itl)


def measure_ttft(llm, prompt_tokens: int = 512, tag: int = 0) -> float:
    """Seconds to the first token of one request with a `prompt_tokens` prompt (pass a new `tag` each time)."""
    return _generate(llm, [synthetic_prompt_ids(llm.tokenizer, prompt_tokens, tag)], 1)[0].metrics.ttft


def measure_step(llm, concurrency: int = 16, decode_tokens: int = 24, tag: int = 0) -> float:
    """Seconds: the median decode step of `concurrency` requests served together (their prompts fit one step)."""
    prompts = [synthetic_prompt_ids(llm.tokenizer, SHORT_PROMPT, tag + i) for i in range(concurrency)]
    return statistics.median(gap for o in _generate(llm, prompts, decode_tokens) for gap in o.metrics.itl)


def core_speedup(device: torch.device | str = "cpu") -> float:
    """A matmul's FLOP/s on all of torch's threads over its FLOP/s on one: about the thread count on an idle
    CPU, near 1 when other programs hold the other cores. On a GPU (or with one thread): the thread count."""
    threads = torch.get_num_threads()
    if torch.device(device).type != "cpu" or threads == 1:
        return float(threads)
    everyone = measure_matmul_flops(device, repeats=3)
    torch.set_num_threads(1)
    try:
        alone = measure_matmul_flops(device, repeats=3)
    finally:
        torch.set_num_threads(threads)
    return everyone / alone


def _steps(llm, prompt_tokens: int, concurrency: int, decode_tokens: int, tag: int) -> list[tuple]:
    """The three checked figures: (name, unit, plan arguments, the plan's seconds, the measured seconds, seconds
    -> the figure's unit).

    Each request's cache while decoding averages SHORT_PROMPT + decode_tokens / 2 tokens."""
    context = SHORT_PROMPT + decode_tokens // 2
    return [
        ("TPOT, 1 request", "ms", dict(context_len=context), lambda p: p.tpot_s,
         lambda: measure_tpot(llm, decode_tokens, tag), lambda t: t * 1e3),
        (f"TTFT, {prompt_tokens}-token prompt", "ms", dict(context_len=prompt_tokens), lambda p: p.ttft_s,
         lambda: measure_ttft(llm, prompt_tokens, tag + 1), lambda t: t * 1e3),
        (f"tokens/s, {concurrency} requests", "tok/s", dict(context_len=context, concurrency=concurrency),
         lambda p: p.tpot_s, lambda: measure_step(llm, concurrency, decode_tokens, tag + 2),
         lambda t: concurrency / t),  # a step's seconds -> the batch's tokens/s
    ]


def measure_round(llm, prompt_tokens: int = 512, concurrency: int = 16, decode_tokens: int = 24,
                  repeats: int = 3, **fractions) -> list[dict]:
    """Each figure measured once, right after this machine's ceilings, next to the plan's prediction from them
    (`fractions`: plan's bandwidth_fraction, prefill_flops_fraction, decode_flops_fraction; default: plan's).
    Each row keeps its `DeploymentPlan`, whose formulas show the arithmetic."""
    cfg, device, dtype = llm.model.config, llm.model.device, dtype_name(llm.model.dtype)
    tag = random.getrandbits(30)  # fresh prompts: a prompt seen before would be answered by the prefix cache
    rows = []
    for figure, unit, args, predicted, measure, to_unit in _steps(llm, prompt_tokens, concurrency, decode_tokens, tag):
        spec = DeviceSpec.measure(device, (dtype,), repeats)
        seconds = measure()
        p = plan(cfg, spec, dtype=dtype, **args, **fractions)
        rows.append({"figure": figure, "unit": unit, "predicted": to_unit(predicted(p)), "measured": to_unit(seconds),
                     "bandwidth": spec.bandwidth, "flops": spec.peak_flops(dtype), "plan": p})
    return rows


def validate(llm, rounds: int = 3, **kwargs) -> pd.DataFrame:
    """Predicted vs measured for `llm` on this machine: the median over `rounds` of `measure_round` (kwargs).

    Columns: unit, predicted, measured, ratio (median of the rounds' predicted / measured), and the median
    ceilings the predictions used. `frame.attrs`: "rounds" (every round's rows), "core_speedup" (the lower
    of `core_speedup` before and after: near 1 means the timings measured other programs as much as the engine)
    and "bandwidth_spread" (the fastest copy over the slowest: above `STEADY_BANDWIDTH` the host's memory
    traffic changed during the run).
    """
    speedup = core_speedup(llm.model.device)
    runs = pd.DataFrame([r for _ in range(rounds) for r in measure_round(llm, **kwargs)])
    runs["ratio"] = runs["predicted"] / runs["measured"]
    table = runs.groupby("figure", sort=False).agg(
        unit=("unit", "first"), predicted=("predicted", "median"), measured=("measured", "median"),
        ratio=("ratio", "median"), bandwidth=("bandwidth", "median"), flops=("flops", "median"))
    table.attrs["rounds"] = runs
    table.attrs["core_speedup"] = min(speedup, core_speedup(llm.model.device))
    table.attrs["bandwidth_spread"] = runs["bandwidth"].max() / runs["bandwidth"].min()
    return table


def busy_cores(*speedups: float) -> str:
    """Why a run with these `core_speedup` readings cannot be judged ("" when it can): another program held a
    core. One reading alone can come out low by chance (a virtual core's time taken by its host for a moment, even
    on an idle host), so the best reading decides."""
    speedup = max(speedups)
    if torch.get_num_threads() > 1 and speedup < BUSY_CORES:
        return (f"another program held a core: {torch.get_num_threads()} threads ran a matmul only {speedup:.2f}x "
                f"as fast as one, and the engine's timings measured it too")
    return ""


def judged(table: pd.DataFrame) -> tuple[pd.Series, str]:
    """The ratios of a `validate` table that its run lets one judge, and why the others were left out ("" when
    none was): none when another program held a core (`busy_cores`), TTFT alone when the copies moved more
    than `STEADY_BANDWIDTH` (the test and chapter 09 both check what this returns)."""
    spread = table.attrs["bandwidth_spread"]
    if busy := busy_cores(table.attrs["core_speedup"]):
        return table.ratio.iloc[:0], busy
    if spread > STEADY_BANDWIDTH:
        return table.ratio[table.index.str.startswith("TTFT")], (
            f"the host's memory traffic changed during the run (the fastest copy {spread:.2f}x the slowest) and "
            f"this engine's decode steps did not follow it: TPOT and tokens/s not judged")
    return table.ratio, ""


def calibrate(llm, rounds: int = 3, prompt_tokens: int = 512, concurrency: int = 16, decode_tokens: int = 24,
              repeats: int = 3) -> tuple[float, float, float]:
    """(bandwidth_fraction, prefill_flops_fraction, decode_flops_fraction) the engine reaches on this machine.

    The three steps `validate` checks, each timed right after the ceilings, give three equations of the
    planner's time model t = bytes / (bandwidth x fb) + FLOPs / (flops x ff): a decode step of 1 request,
    a `prompt_tokens` prefill, a decode step of `concurrency` requests. Solved each round; the median of the
    rounds is returned.
    """
    cfg, device, dtype = llm.model.config, llm.model.device, dtype_name(llm.model.dtype)
    read = weight_memory(cfg, dtype).read  # the engine's float model
    fractions = []
    for _ in range(rounds):
        a, t = np.zeros((3, 3)), np.zeros(3)
        steps = _steps(llm, prompt_tokens, concurrency, decode_tokens, random.getrandbits(30))
        for i, (figure, _, args, _, measure, _) in enumerate(steps):
            prefill = figure.startswith("TTFT")
            cost = prefill_cost(cfg, args["context_len"], dtype=dtype, weight_bytes=read, logits_tokens=1) if prefill \
                else decode_cost(cfg, args["context_len"], batch=args.get("concurrency", 1), dtype=dtype,
                                 weight_bytes=read)
            spec = DeviceSpec.measure(device, (dtype,), repeats)
            t[i] = measure()
            a[i, 0], a[i, 1 if prefill else 2] = cost.bytes / spec.bandwidth, cost.flops / spec.peak_flops(dtype)
        fractions.append(1 / np.linalg.solve(a, t))  # a @ (1/fb, 1/ff_prefill, 1/ff_decode) = t
    return tuple(float(f) for f in np.median(np.array(fractions), axis=0))
