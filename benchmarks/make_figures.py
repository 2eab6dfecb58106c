"""Regenerate every figure in figures/ on this machine (`make figures`).

    python -m benchmarks.make_figures                     # all of them, default model, torch's thread count
    python -m benchmarks.make_figures --threads 1         # steadier numbers on a busy machine
    python -m benchmarks.make_figures --only ttft tpot    # a subset
    python -m benchmarks.make_figures --levels 1 2 4 8 16 32 --requests-per-level 64   # a bigger sweep

    roofline.png                  measured ceilings, a 512-token prefill and a batch-1 decode step (benchmarks.roofline)
    ttft_vs_prompt_length.png     TTFT of lone requests against prompt length: prefill, compute-bound
    tpot_vs_context_length.png    decode time per token of lone requests against context length
    throughput_vs_concurrency.png closed-loop load test at each concurrency: output tokens/s against latency
    chapters/NN.png, pipeline.png the README's thumbnails, taken from the saved chapters (benchmarks.thumbnails)

Every latency is measured through the serving engine (`LLMEngine`), as a client would see it.
The script prints the fitted slopes against the source material's claims: TTFT grows with the
input (prefill), TPOT is the decode speed and barely depends on the prompt.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from benchmarks import roofline, thumbnails  # noqa: E402
from course_lib import load_tokenizer  # noqa: E402
from course_lib.dtypes import resolve_device_dtype  # noqa: E402
from course_lib.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from course_lib.profiling.loadtest import fit_line, single_request_latency, sweep_concurrency  # noqa: E402
from course_lib.profiling.memory import weight_bytes  # noqa: E402
from course_lib.profiling.roofline import measure_decode  # noqa: E402
from course_lib.profiling.plots import (plot_latency_vs_length, plot_throughput_vs_concurrency,  # noqa: E402
                                        plot_throughput_vs_latency)

FIGURES = ("roofline", "ttft", "tpot", "throughput", "chapters")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES), help="which figures to make")
    ap.add_argument("--out-dir", default="figures")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    ap.add_argument("--random", action="store_true", help="random weights of the default model's shape")
    ap.add_argument("--prompt-lengths", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024],
                    help="prompt tokens for the TTFT figure")
    ap.add_argument("--context-lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048],
                    help="prompt tokens before decoding, for the TPOT figure")
    ap.add_argument("--decode-tokens", type=int, default=8, help="tokens generated per lone request")
    ap.add_argument("--repeats", type=int, default=1, help="requests per length")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="concurrency levels")
    ap.add_argument("--requests-per-level", type=int, default=None,
                    help="default: max(--min-requests, 2 x concurrency)")
    ap.add_argument("--min-requests", type=int, default=8, help="fewest requests at any concurrency level")
    ap.add_argument("--sweep-prompt-tokens", type=int, default=64)
    ap.add_argument("--sweep-output-tokens", type=int, default=16)
    return ap.parse_args(argv)


def save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"saved {path}")


def latency_figures(engine: LLMEngine, args: argparse.Namespace, machine: str, out_dir: Path) -> None:
    """Lone requests of each length: TTFT against prompt length, TPOT against context length."""
    want = [f for f in ("ttft", "tpot") if f in args.only]
    lengths = sorted(set(args.prompt_lengths if "ttft" in want else [])
                     | set(args.context_lengths if "tpot" in want else []))
    t = time.perf_counter()
    frame = single_request_latency(engine, lengths, output_tokens=args.decode_tokens, repeats=args.repeats)
    per_len = frame.groupby("prompt_tokens")[["ttft", "tpot"]].median()
    print(f"lone requests ({time.perf_counter() - t:.0f} s), {args.decode_tokens} output tokens each, median of "
          f"{args.repeats}:\n{(per_len * 1e3).round(1).rename(columns=lambda c: c + ' ms').to_string()}")

    if "ttft" in want:
        rows = frame[frame["prompt_tokens"].isin(args.prompt_lengths)]
        slope, intercept = fit_line(rows["prompt_tokens"], rows["ttft"])
        ttft = per_len["ttft"]
        lo, hi = min(args.prompt_lengths), max(args.prompt_lengths)
        grows = "holds" if slope > 0 and ttft[hi] > ttft[lo] else "FAILS"
        print(f"TTFT: {slope * 1e3:.2f} ms per prompt token (prefill ~{1 / slope:.0f} tokens/s) "
              f"+ {intercept * 1e3:.0f} ms fixed; {ttft[lo] * 1e3:.0f} ms at {lo} tokens -> "
              f"{ttft[hi] * 1e3:.0f} ms at {hi} ({ttft[hi] / ttft[lo]:.1f}x). "
              f"Claim 'TTFT grows with input length': {grows}")
        ax = plot_latency_vs_length(rows["prompt_tokens"], rows["ttft"], ylabel="time to first token (ms)",
                                    xlabel="prompt length (tokens)",
                                    title=f"TTFT against prompt length (one request at a time)\n{machine}")
        save(ax.figure, out_dir / "ttft_vs_prompt_length.png")

    if "tpot" in want:
        rows = frame[frame["prompt_tokens"].isin(args.context_lengths)]
        context = rows["prompt_tokens"] + args.decode_tokens / 2  # mean tokens attended over the decode steps
        slope, intercept = fit_line(context, rows["tpot"])
        tpot = per_len["tpot"]
        lo, hi = min(args.context_lengths), max(args.context_lengths)
        weights = weight_bytes(engine.model)
        print(f"TPOT: {tpot[lo] * 1e3:.0f} ms at {lo} tokens of context ({1 / tpot[lo]:.1f} tokens/s), "
              f"{tpot[hi] * 1e3:.0f} ms at {hi} ({1 / tpot[hi]:.1f} tokens/s, {tpot[hi] / tpot[lo]:.2f}x); "
              f"slope {slope * 1e6:.1f} µs per context token. Claim 'TPOT is decode speed, set by bandwidth': each "
              f"token reads the {weights / 1e6:.0f} MB of weights, {weights / tpot[lo] / 1e9:.1f} GB/s effective")
        steps = [measure_decode(engine.model, n, repeats=5, warmup=1).seconds for n in args.context_lengths]
        print("model decode step alone (contiguous KV cache, no engine), median of 5: "
              + ", ".join(f"{n}: {t * 1e3:.0f} ms" for n, t in zip(args.context_lengths, steps)))
        ax = plot_latency_vs_length(context, rows["tpot"], ylabel="time per output token (ms)",
                                    xlabel="context length (tokens in the KV cache)",
                                    label="TPOT through the engine (paged KV cache, scheduler, sampler)",
                                    title=f"TPOT against context length (one request at a time)\n{machine}")
        plot_latency_vs_length(args.context_lengths, steps, ax=ax, color="tab:green",
                               label="model decode step alone (contiguous KV cache)")
        save(ax.figure, out_dir / "tpot_vs_context_length.png")


def throughput_figure(engine: LLMEngine, args: argparse.Namespace, machine: str, out_dir: Path) -> None:
    """Closed-loop load test at each concurrency: throughput, p50 TPOT and p90 TTFT."""
    t = time.perf_counter()
    sweep = sweep_concurrency(engine, args.levels, prompt_tokens=args.sweep_prompt_tokens,
                              output_tokens=args.sweep_output_tokens, requests_per_level=args.requests_per_level,
                              min_requests=args.min_requests, verbose=True)
    table = sweep[["concurrency", "requests", "output_throughput", "ttft_p50", "ttft_p90", "tpot_p50",
                   "e2e_latency_p50", "mean_batch_size"]].copy()
    for c in ("ttft_p50", "ttft_p90", "tpot_p50", "e2e_latency_p50"):
        table[c] = (table[c] * 1e3).round(0)
    print(f"concurrency sweep ({time.perf_counter() - t:.0f} s), prompts {args.sweep_prompt_tokens} tokens, "
          f"{args.sweep_output_tokens} output tokens each (latencies in ms):\n{table.round(1).to_string(index=False)}")
    base = sweep["output_throughput"].iloc[0]
    gains = zip(sweep["concurrency"], sweep["output_throughput"] / base)
    print("throughput against concurrency 1: " + ", ".join(f"C={c}: {g:.1f}x" for c, g in gains))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    plot_throughput_vs_concurrency(sweep, ax=left, title="Throughput and latency against concurrency")
    plot_throughput_vs_latency(sweep, "tpot_p50", ax=right, title="Throughput against p50 TPOT")
    fig.suptitle(f"Closed-loop load test: {args.sweep_prompt_tokens}-token prompts, {args.sweep_output_tokens} "
                 f"output tokens each; {machine}", fontsize=10)
    save(fig, out_dir / "throughput_vs_concurrency.png")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    start, status = time.perf_counter(), 0
    if "roofline" in args.only:
        status = roofline.main(["--out", str(out_dir / "roofline.png"), "--device", str(device),
                                "--dtype", str(dtype).removeprefix("torch."), *(["--random"] if args.random else []),
                                *(["--threads", str(args.threads)] if args.threads else [])])
    if "chapters" in args.only:  # the README's thumbnails and pipeline, from the saved chapters (seconds)
        status = thumbnails.main(["--out-dir", str(out_dir)]) or status
    if set(args.only) - {"roofline", "chapters"}:
        model, label = roofline.load(args.random, device, dtype)
        tokenizer = load_tokenizer()
        name = label[label.index("(") + 1:-1] if label.endswith(")") else label
        threads = torch.get_num_threads()
        machine = (f"{name}, {device.type} {str(dtype).removeprefix('torch.')}, "
                   f"{threads} CPU thread{'' if threads == 1 else 's'}")
        print(f"measuring on {machine}")
        if {"ttft", "tpot"} & set(args.only):
            longest = max(args.prompt_lengths + args.context_lengths)
            config = EngineConfig(enable_prefix_caching=False, max_num_batched_tokens=longest)  # one-step prefills
            latency_figures(LLMEngine(model, tokenizer, config), args, machine, out_dir)
        if "throughput" in args.only:
            throughput_figure(LLMEngine(model, tokenizer, EngineConfig()), args, machine, out_dir)
    print(f"done in {time.perf_counter() - start:.0f} s with {torch.get_num_threads()} CPU threads")
    return status


if __name__ == "__main__":
    sys.exit(main())
