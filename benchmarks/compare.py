"""The engine against `transformers` and llama.cpp, side by side in one run, with ratios and roofline fractions.

    python -m benchmarks.compare                       # float32, bfloat16, int8, int4 on this machine
    python -m benchmarks.compare --quick               # small sizes: a smoke run in about a minute
    python -m benchmarks.compare --dtypes float32 --json out.json

For each precision it measures, on the default model, greedy with EOS ignored:
- batch-1 decode tokens/s after a 32-token prompt, with the GB/s that implies (bytes one decode step reads:
  weights + KV, `course_lib.profiling.step_bytes`) and its fraction of this machine's measured read bandwidth;
- TTFT of a 512-token prompt, with the FLOP/s it implies and its fraction of the measured matmul peak;
- output tokens/s of 16 and 64 requests submitted at once, with uniform (64 tokens each) and long-tailed
  (log-normal around 24, clipped to [8, 128]) output lengths. `transformers` runs them as one padded batch
  and keeps computing for finished rows until the longest is done; only the tokens asked for are counted.
Engine variants (`--engines`, default "engine accel,engine compiled"): "engine accel" (`LLM(accel=True)`: this
machine's plan, `python -m course_lib.accel` prints it) and "engine compiled" (`LLM(accel=True,
compile_decode=True)`; its compile time is printed and kept in the JSON); "engine" (`LLM()`, the pure-PyTorch
reference) can be added to see what `course_lib.accel` gains. Each runs steps of up to 4096 tokens
(`OFFLINE_BATCHED_TOKENS`, vLLM's offline setting on the CPU). Right after each engine is built, one short greedy
`generate` is timed twice (`first_generate_ratio`: the first call over the second), because one-time costs paid on
the first call (lazy allocations, kernels' first use) are hidden by the warm-up round of the figures below.
Peers: `transformers` `generate` in float32 and bfloat16 on the same device; llama.cpp through
`llama-cpp-python` on the very same Q4_1 GGUF file, when installed (`make bench-peers`); and llama.cpp's own
`llama-bench` (tg64, pp512, `-t` = the engine's threads, same file), run before and after the engine's INT4 rows,
where the binary is found ($LLAMA_CPP_BIN's folder, `make bench-peers`' build, or PATH).
Floors against the roofline, printed at the end: batch-1 decode bytes/s (tokens/s x bytes a step reads) as a
fraction of the measured copy bandwidth, at least `DECODE_FLOORS`; batches of 64 as a fraction of the measured
matmul FLOP/s. INT8 and INT4
rows keep everything that is not a quantized linear layer in bfloat16.
All systems of one precision are loaded at once and take turns: each round runs every one of them once
(`rounds`), so a machine whose speed drifts slows them alike. Figures are medians of the rounds after a
warm-up round (`Workload.repeats`, the batches too, because a single round moves with the host's noise; TTFT
takes `Workload.ttft_repeats` rounds, because they are short and a few of them give no steady median). Each
ratio is engine / peer (higher is better). Measured figures and their history: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from course_lib import LLM, SamplingParams
from course_lib.chapter import processor_name, quiet_libraries
from course_lib.loading import default_gguf_path, load_reference_model
from course_lib.profiling import step_bytes, step_flops
from course_lib.profiling.roofline import Ceilings, measure_bandwidth, measure_matmul_flops, weights_read
from course_lib.profiling.loadtest import synthetic_prompt_ids
from course_lib.profiling.memory import weight_bytes
from course_lib.profiling.timer import synchronize


# Batch-1 decode: bytes/s a step reads, as a fraction of the measured copy bandwidth, that accel=True must reach
# (issue 60): float32 0.7; bfloat16 0.6 also without bfloat16 arithmetic (widening it to float32 is a shift); INT4 0.6.
DECODE_FLOORS = {"float32": 0.7, "bfloat16": 0.6, "int4": 0.6}


@dataclass
class Result:
    """One measured figure of one system."""

    system: str  # "engine", "transformers", "llama.cpp"
    precision: str  # "float32", "bfloat16", "int8", "int4", "Q4_1"
    metric: str  # "decode_tok_s", "ttft_512_s", "throughput_16_uniform", ...
    value: float
    unit: str
    extra: dict = field(default_factory=dict)  # implied GB/s, fraction of a roof, spread


@dataclass
class Workload:
    decode_tokens: int = 64
    prompt_tokens: int = 512
    concurrency: tuple[int, ...] = (16, 64)
    uniform_output: int = 64
    repeats: int = 3
    ttft_repeats: int = 9  # TTFTs are short, so more rounds cost little; see `measure_systems`
    output_kinds: tuple[str, ...] = ("uniform", "long-tailed")


def output_lengths(n: int, kind: str, uniform: int, seed: int = 0) -> list[int]:
    if kind == "uniform":
        return [uniform] * n
    rng = np.random.default_rng(seed)  # long-tailed: most answers short, a few long
    return [int(min(max(round(x), 8), 128)) for x in rng.lognormal(math.log(24), 0.8, size=n)]


# Tokens a step may run, on any device: vLLM's default for its offline `LLM` on the CPU (on GPUs its default
# is 8192, 16384 from 70 GB of memory). benchmarks/gpu_check.py builds its engine with the same.
OFFLINE_BATCHED_TOKENS = 4096


class EngineSystem:
    """The engine through its offline API, prefix caching off (every prompt pays for its prefill).

    Steps of up to `OFFLINE_BATCHED_TOKENS` tokens, as vLLM's `LLM` runs on the CPU (its server: 2048;
    this engine's default: 1024, for short steps while others decode), because bigger steps give oneDNN
    bigger matmuls (measured in benchmarks/RESULTS.md).
    """

    def __init__(self, llm: LLM, name: str = "engine"):
        self.llm, self.name, self.model = llm, name, llm.model
        self.compile_seconds = llm.engine.stats.compile_seconds

    @classmethod
    def load(cls, device, dtype, variant: str = "engine accel", quantization: str | None = None) -> "EngineSystem":
        """The default model as one of the variants of `ENGINES`."""
        if variant not in ENGINES:
            raise ValueError(f"unknown engine variant {variant!r}; choose from {ENGINES}")
        return cls(LLM(device=device, dtype=dtype, quantization=quantization, enable_prefix_caching=False,
                       accel=variant != "engine", compile_decode=variant == "engine compiled",
                       max_num_batched_tokens=OFFLINE_BATCHED_TOKENS), variant)

    def first_generate(self, prompt: list[int], n: int = 16) -> tuple[float, float]:
        """Seconds of a greedy `generate` of n tokens after `prompt`, the first call and the same call again: the
        first pays what the engine does once, on first use. Call it right after construction."""
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        first = timed(self.llm.generate, [prompt], params)
        return first, timed(self.llm.generate, [prompt], params)

    def decode(self, prompt: list[int], n: int) -> float:
        """Seconds between the first and the last of n tokens."""
        out = self.llm.generate([prompt], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))[0]
        assert len(out.outputs[0].token_ids) == n
        return out.metrics.finished_time - out.metrics.first_token_time

    def ttft(self, prompt: list[int]) -> None:
        self.llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))

    def batch(self, prompts: list[list[int]], lengths: list[int]) -> None:
        outs = self.llm.generate(prompts, [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                                           for n in lengths])
        assert [len(o.outputs[0].token_ids) for o in outs] == lengths


class _TokenTimes:
    """A `transformers` streamer that only notes when each token arrives (after the device finished it)."""

    def __init__(self, device):
        self.device, self.times = device, []

    def put(self, value) -> None:
        synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class TransformersSystem:
    """`transformers` `generate`, greedy, on the same device and dtype; a padded static batch for many requests."""

    name = "transformers"

    def __init__(self, model):
        self.model, self.device = model.eval(), model.device
        self.pad = self.model.config.eos_token_id if isinstance(self.model.config.eos_token_id, int) else 0

    @classmethod
    def load(cls, device, dtype) -> "TransformersSystem":
        """transformers' own reading of the default model's GGUF file."""
        return cls(load_reference_model(dtype).to(device))

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], n: int, streamer=None) -> None:
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=self.pad, streamer=streamer)

    def decode(self, prompt: list[int], n: int) -> float:
        """Seconds between the first and the last of n tokens, stamped as `generate` hands each one out (as the
        engine's metrics do). Timing n tokens and subtracting a 1-token run instead went negative on a noisy
        CPU in float16."""
        stamps = _TokenTimes(self.device)
        self._generate([prompt], n, stamps)
        return stamps.times[-1] - stamps.times[1]  # times[0]: the prompt, handed out first

    def ttft(self, prompt: list[int]) -> None:
        self._generate([prompt], 1)

    def batch(self, prompts: list[list[int]], lengths: list[int]) -> None:
        self._generate(prompts, max(lengths))


class LlamaCppSystem:
    """llama.cpp on the same GGUF file, one request at a time (llama-cpp-python's high-level API).

    Two instances. Decode runs with llama.cpp's "extra buffer types" (on AMX Xeons an AMX repack of
    the Q4_1 weights, faster than without it), fed one token per batch, because
    that AMX matmul segfaults on multi-token batches (seen here with llama-cpp-python 0.3.36;
    llama.cpp issue #20824). TTFT runs without them, the prompt in one batch of up to 512 tokens.
    """

    name, precision = "llama.cpp", "Q4_1"

    def __init__(self, threads: int):
        self.weight_bytes = default_gguf_path().stat().st_size
        self.llm = _llama(threads, n_batch=1, extra_buffers=True)  # decode
        self.prefill_llm = _llama(threads, n_batch=512, extra_buffers=False)  # TTFT
        eos = self.llm.token_eos()
        from llama_cpp import LogitsProcessorList

        self.no_eos = LogitsProcessorList([lambda ids, scores: _banned(scores, eos)])

    def _run(self, llm, prompt: list[int], n: int) -> tuple[float, float, int]:
        """(seconds to the first token, seconds from the first to the n-th, tokens made), greedy."""
        llm.reset()  # no reuse of the previous prompt's KV cache
        t0, first, count = time.perf_counter(), None, 0
        for _ in llm.generate(prompt, temp=0.0, logits_processor=self.no_eos):
            count += 1
            first = first or time.perf_counter()
            if count == n:
                break
        return first - t0, time.perf_counter() - first, count

    def decode(self, prompt: list[int], n: int) -> float:
        _, rest, count = self._run(self.llm, prompt, n)
        assert count == n, f"llama.cpp produced {count} of {n} tokens"
        return rest

    def ttft(self, prompt: list[int]) -> None:
        self._run(self.prefill_llm, prompt, 1)


def _llama(threads: int, n_batch: int, extra_buffers: bool):
    import llama_cpp.llama_cpp as lib
    from llama_cpp import Llama

    default_params = lib.llama_model_default_params  # Llama() has no option for extra buffer types

    def params():
        p = default_params()
        p.use_extra_bufts = extra_buffers
        return p

    lib.llama_model_default_params = params
    try:
        return Llama(model_path=str(default_gguf_path()), n_ctx=2048, n_batch=n_batch, n_ubatch=n_batch,
                     n_threads=threads, n_threads_batch=threads, verbose=False)
    finally:
        lib.llama_model_default_params = default_params


def _banned(scores: np.ndarray, token: int) -> np.ndarray:
    scores[token] = -np.inf
    return scores


def rounds(systems: list, measure, repeats: int) -> dict[str, list[float]]:
    """`measure(system)` for every system in turn, `repeats` rounds after one warm-up round.

    The systems alternate within each round (in an order that rotates from round to round), so a
    machine whose speed drifts by the minute slows them alike and their ratio holds; one system
    after another, ratios of the same code drifted by 1.5x on a noisy 2-core machine.
    """
    values: dict[str, list[float]] = {s.name: [] for s in systems}
    for r in range(repeats + 1):
        for s in systems[r % len(systems):] + systems[:r % len(systems)]:
            value = measure(s)
            if r:
                values[s.name].append(value)
    return values


def timed(fn, *args) -> float:
    """Seconds of `fn(*args)`, the GPU's queued work included: synchronised before both clock reads."""
    synchronize()
    t = time.perf_counter()
    fn(*args)
    synchronize()
    return time.perf_counter() - t


def measure_systems(systems: list, precision: str, work: Workload, tok, config, ceilings: Ceilings | None,
                    wbytes: int) -> list[Result]:
    """Every metric of `work` for every system, the systems taking turns (`rounds`).

    A system may carry its own `precision` label and `weight_bytes` (llama.cpp: its Q4_1 file);
    the others are `precision` with `wbytes` of weights. With `ceilings` None, no roofline fractions."""
    results = []
    by_name = {s.name: s for s in systems}
    label = {s.name: getattr(s, "precision", precision) for s in systems}
    short = synthetic_prompt_ids(tok, 32, tag=1)
    n = work.decode_tokens
    ctx = len(short) + n // 2  # the average context of the decode steps
    for name, rates in rounds(systems, lambda s: (n - 1) / s.decode(short, n), work.repeats).items():
        rate = statistics.median(rates)
        weights = getattr(by_name[name], "weight_bytes", wbytes)
        moved = sum(step_bytes(config, context_len=ctx, dtype=_float_dtype(precision), weight_bytes=weights).values())
        roof = {} if ceilings is None else {"GB/s": rate * moved / 1e9,
                                            "of_bandwidth": rate * moved / ceilings.bandwidth}
        results.append(Result(name, label[name], "decode_tok_s", rate, "tok/s",
                              {**roof, "spread": [min(rates), max(rates)]}))

    long = synthetic_prompt_ids(tok, work.prompt_tokens, tag=2)
    flops = sum(step_flops(config, new_tokens=work.prompt_tokens, logits_tokens=1).values())
    # A TTFT round takes under a second: more of them (`ttft_repeats`) cost little and steady a noisy host's median.
    for name, times in rounds(systems, lambda s: timed(s.ttft, long), work.ttft_repeats).items():
        sec = statistics.median(times)
        roof = {} if ceilings is None else {"TFLOP/s": flops / sec / 1e12,
                                            "of_peak": flops / sec / ceilings.peak_flops}
        results.append(Result(name, label[name], f"ttft_{work.prompt_tokens}_s", sec, "s",
                              {**roof, "spread": [min(times), max(times)]}))

    batching = [s for s in systems if hasattr(s, "batch")]
    for c in work.concurrency if batching else ():
        prompts = [synthetic_prompt_ids(tok, 48 + (i * 37) % 80, tag=100 + i) for i in range(c)]
        for kind in work.output_kinds:
            lengths = output_lengths(c, kind, work.uniform_output)
            measured = rounds(batching, lambda s: timed(s.batch, prompts, lengths), work.repeats)
            # the matmuls of the whole run: each request is one causal pass over its prompt and output
            batch_flops = sum(sum(step_flops(config, new_tokens=len(p) + n - 1, logits_tokens=n).values())
                              for p, n in zip(prompts, lengths))
            for name, times in measured.items():
                sec = statistics.median(times)
                roof = {} if ceilings is None else {"TFLOP/s": batch_flops / sec / 1e12,
                                                    "of_peak": batch_flops / sec / ceilings.peak_flops}
                results.append(Result(name, label[name], f"throughput_{c}_{kind}", sum(lengths) / sec, "tok/s", {
                    **roof, "seconds": sec, "output_tokens": sum(lengths), "spread": [min(times), max(times)]}))
    return results


ENGINES = ("engine", "engine accel", "engine compiled")  # LLM(); LLM(accel=True); LLM(accel=True, compile_decode=True)
DEFAULT_ENGINES = "engine accel,engine compiled"


def _float_dtype(precision: str) -> torch.dtype:
    """The model's float dtype: INT8/INT4 layers compute in bfloat16 on the CPU, so their rows keep the
    embeddings, norms and float lm_head in bfloat16 too (57 MB instead of 113 MB read a token)."""
    return {"float32": torch.float32, "float16": torch.float16}.get(precision, torch.bfloat16)


def print_table(results: list[Result]) -> None:
    metrics = list(dict.fromkeys(r.metric for r in results))
    columns = list(dict.fromkeys((r.system, r.precision) for r in results))
    by = {(r.system, r.precision, r.metric): r for r in results}
    head = f"{'metric':<26}" + "".join(f"{s + ' ' + p:>24}" for s, p in columns)
    print(head + "\n" + "-" * len(head))
    for m in metrics:
        cells = []
        for s, p in columns:
            r = by.get((s, p, m))
            if r is None:
                cells.append(f"{'—':>24}")
                continue
            note = ""
            if "of_bandwidth" in r.extra:
                note = f" ({r.extra['GB/s']:.1f}GB/s {r.extra['of_bandwidth']:.0%})"
            elif "of_peak" in r.extra:
                note = f" ({r.extra['of_peak']:.0%} peak)"
            value = {"s": f"{r.value * 1e3:.0f} ms", "x": f"{r.value:.2f}x"}.get(r.unit, f"{r.value:.1f}")
            cells.append(f"{value + note:>24}")
        print(f"{m:<26}" + "".join(cells))


def print_floors(results: list[Result]) -> None:
    """The engines' roofline fractions: batch-1 decode against `DECODE_FLOORS`, batches of 64 against the matmul peak."""
    print("\nroofline fractions (engine rows; batch-1 decode: bytes/s over copy bandwidth, floor from issue 60)")
    for r in results:
        if not r.system.startswith("engine") or "of_bandwidth" not in r.extra and "of_peak" not in r.extra:
            continue
        if r.metric == "decode_tok_s":
            floor = DECODE_FLOORS.get(r.precision)
            verdict = "" if floor is None else f"  floor {floor:.2f}: {'meets' if r.extra['of_bandwidth'] >= floor else 'BELOW'}"
            print(f"  {r.system:<16} {r.precision:<9} batch-1 decode {r.extra['of_bandwidth']:.2f} of copy bandwidth "
                  f"({r.extra['GB/s']:.1f} GB/s){verdict}")
        elif r.metric.startswith("throughput_64"):
            print(f"  {r.system:<16} {r.precision:<9} {r.metric:<26} {r.extra['of_peak']:.2f} of matmul peak "
                  f"({r.extra['TFLOP/s'] * 1e3:.0f} GFLOP/s)")


def llama_bench_binary() -> str | None:
    """llama.cpp's `llama-bench`: benchmarks.peers' finder where it exists, else the folder $LLAMA_CPP_BIN names,
    else PATH; None when absent."""
    try:
        from benchmarks.peers import binary  # make bench-peers' build and finder
    except ImportError:
        folder = os.environ.get("LLAMA_CPP_BIN")
        found = shutil.which("llama-bench", path=folder) if folder else None
        return found or shutil.which("llama-bench")
    found = binary("llama-bench")
    return None if found is None else str(found)


def llama_bench(binary: str, threads: int, repetitions: int = 3) -> dict[str, float]:
    """llama-bench on the default GGUF file with `threads` threads: {"tg64": tok/s, "pp512": tok/s}, means of
    `repetitions` runs each."""
    run = subprocess.run([binary, "-m", str(default_gguf_path()), "-t", str(threads), "-p", "512", "-n", "64",
                          "-r", str(repetitions), "-o", "json"], capture_output=True, text=True, check=True)
    rows = json.loads(run.stdout)
    return {("pp512" if r["n_prompt"] else "tg64"): float(r["avg_ts"]) for r in rows}


def print_llama_bench(before: dict[str, float], after: dict[str, float], results: list[Result]) -> None:
    """llama-bench before and after the engine's INT4 rows, and the engine over their mean."""
    by = {(r.system, r.metric): r for r in results if r.precision == "int4"}
    print("llama-bench (same GGUF, same threads), before / after the engine's INT4 rows:")
    for test, metric in (("tg64", "decode_tok_s"), ("pp512", "ttft_512_s")):
        mean = (before[test] + after[test]) / 2
        line = f"  {test:<6} {before[test]:.1f} / {after[test]:.1f} tok/s"
        for engine in ENGINES:
            r = by.get((engine, metric))
            if r is not None:
                mine = r.value if metric == "decode_tok_s" else 512 / r.value
                line += f"; {engine} int4 {mine:.1f} tok/s = {mine / mean:.2f}x"
        print(line)


def ratios(results: list[Result]) -> list[dict]:
    """Engine / peer for every metric both measured (for TTFT: peer time / engine time)."""
    by = {(r.system, r.precision, r.metric): r for r in results}
    rows = []
    for r in results:
        if r.system.startswith("engine"):
            continue
        for engine in ENGINES:
            mine = by.get((engine, r.precision if r.system == "transformers" else "int4", r.metric))
            if mine is None:
                continue
            ratio = r.value / mine.value if r.unit == "s" else mine.value / r.value
            rows.append({"metric": r.metric, "engine": f"{engine} {mine.precision}", "peer": f"{r.system} {r.precision}",
                         "engine_over_peer": ratio})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16,int8,int4",
                    help="comma-separated: float32, bfloat16, int8, int4 (int8/int4: engine only, + llama.cpp)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--quick", action="store_true", help="small sizes: decode 16, prompt 128, concurrency 4")
    ap.add_argument("--engines", default=DEFAULT_ENGINES,
                    help=f"comma-separated engine variants to run, of: {', '.join(ENGINES)} (\"engine\" is the "
                         f"pure-PyTorch reference; default: {DEFAULT_ENGINES})")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--llama-bench-repetitions", type=int, default=3, help="llama-bench -r (default 3)")
    ap.add_argument("--json", default=None, help="write every result and ratio to this file")
    args = ap.parse_args()
    quiet_libraries()
    work = Workload(decode_tokens=16, prompt_tokens=128, concurrency=(4,), uniform_output=16, repeats=1,
                    ttft_repeats=1) \
        if args.quick else Workload()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    precisions = args.dtypes.split(",")
    variants = args.engines.split(",")
    if unknown := [v for v in variants if v not in ENGINES]:
        raise SystemExit(f"unknown engine variant(s) {unknown}; choose from {ENGINES}")
    print(f"{processor_name(device)}, {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")

    results: list[Result] = []
    ceilings = {}
    bandwidth = measure_bandwidth(device, torch.float32)  # bytes move at the same speed in any dtype

    def ceilings_for(fdtype: torch.dtype) -> Ceilings:
        if fdtype not in ceilings:
            c = ceilings[fdtype] = Ceilings(measure_matmul_flops(device, fdtype), bandwidth, str(device),
                                             str(fdtype).removeprefix("torch."))
            print(f"ceilings {c.dtype}: {c.peak_flops / 1e9:.0f} GFLOP/s matmul, {c.bandwidth / 1e9:.1f} GB/s copy")
        return ceilings[fdtype]

    peer = importlib.util.find_spec("llama_cpp") is not None and device.type == "cpu"
    if not peer:
        print("llama.cpp: not installed (make bench-peers), left out")
    bench = llama_bench_binary() if "int4" in precisions and device.type == "cpu" else None
    if "int4" in precisions and bench is None:
        print("llama-bench: not found (make bench-peers, or $LLAMA_CPP_BIN), its rows left out")
    benched = {}
    for precision in precisions:  # every system of one precision loaded at once, measured taking turns
        fdtype = _float_dtype(precision)
        if precision == "int4" and bench is not None:
            benched["before"] = llama_bench(bench, torch.get_num_threads(), args.llama_bench_repetitions)
            print(f"llama-bench before the INT4 rows: {benched['before']}", flush=True)
        quant = precision if precision in ("int8", "int4") else None
        systems, first_calls = [], []
        for variant in variants:
            engine = EngineSystem.load(device, fdtype, variant, quant)
            tok, config = engine.llm.tokenizer, engine.model.config
            first, second = engine.first_generate(synthetic_prompt_ids(tok, 32, tag=3))
            first_calls.append(Result(engine.name, precision, "first_generate_ratio", first / second, "x",
                                      {"first_s": first, "second_s": second}))
            wbytes = weights_read(engine.model)  # what a decode step reads (not a packed lm_head's tied twin)
            compiled = f", compiled in {engine.compile_seconds:.0f} s" if engine.compile_seconds else ""
            print(f"{engine.name} {precision}: weights {weight_bytes(engine.model) / 1e6:.0f} MB held, "
                  f"{wbytes / 1e6:.0f} MB read a step{compiled}; first generate {first * 1e3:.0f} ms, "
                  f"second {second * 1e3:.0f} ms ({first / second:.2f}x)", flush=True)
            systems.append(engine)
        if quant is None and not args.no_transformers:
            systems.append(TransformersSystem.load(device, fdtype))
        if precision == "int4" and peer:
            systems.append(LlamaCppSystem(torch.get_num_threads()))  # the same Q4_1 weights, as llama.cpp runs them
        print(f"{precision}: measuring {', '.join(s.name for s in systems)}, taking turns ...", flush=True)
        measured = measure_systems(systems, precision, work, tok, config, ceilings_for(fdtype), wbytes) + first_calls
        by_name = {s.name: s for s in systems}
        for r in measured:
            r.extra["compile_seconds"] = getattr(by_name[r.system], "compile_seconds", 0.0)
        results += measured
        print_table(measured)  # each precision as it finishes: a full run takes ~40 minutes on 2 cores
        if precision == "int4" and bench is not None:
            benched["after"] = llama_bench(bench, torch.get_num_threads(), args.llama_bench_repetitions)
            print_llama_bench(benched["before"], benched["after"], measured)
        print(flush=True)
        del systems, engine, by_name
        gc.collect()

    print()
    print_table(results)
    print_floors(results)
    rows = ratios(results)
    print("\nengine / peer (above 1: the engine is ahead)")
    for r in rows:
        print(f"  {r['metric']:<26} {r['engine']:<22} vs {r['peer']:<22} {r['engine_over_peer']:.2f}x")
    if args.json:
        info = {"device": str(device), "processor": processor_name(device), "threads": torch.get_num_threads(),
                "torch": torch.__version__, "python": platform.python_version(), "workload": asdict(work),
                "engine_max_num_batched_tokens": OFFLINE_BATCHED_TOKENS,
                "ceilings": {str(k): asdict(v) for k, v in ceilings.items()}, "llama_bench": benched,
                "decode_floors": DECODE_FLOORS}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"info": info, "results": [asdict(r) for r in results], "ratios": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
