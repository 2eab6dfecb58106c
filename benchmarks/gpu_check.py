"""The GPU path checked in one call: versions, correctness against transformers, Triton kernels, speed.

    python -m benchmarks.gpu_check --json gpu.json     # on any CUDA machine, in under 8 minutes
    python -m benchmarks.gpu_check --cpu --json out.json   # the same checks at small sizes on the CPU (CI runs it)

1. The machine: GPU, compute capability, memory, versions, and the dtype the engine's policy picks
   (`course_lib.dtypes.default_dtype`: bfloat16 from Ampere on, float16 on a T4).
2. The engine against `transformers` on random weights of two real shapes, built here (no downloads):
   SmolLM2-135M (the default model) and Llama-3.2-1B. Both read the same tensors. In float32, float16 and
   bfloat16 (where the GPU has it natively): the logits of one 48-token prompt, and 24 greedy tokens through
   the engine's paged cache, each of which must be the reference's greedy choice up to the dtype's rounding
   (TOLERANCE).
   Then, where a GPU and a network exist, the GPU chapters' real model (`course_lib.chapter.GPU_MODEL`, from the
   Hub) in float16 against float32 on real prompts: the largest activation as a fraction of float16's largest
   number (65504: random weights never come near it, real ones may), and how often the two agree on the top
   token; without either it is reported as skipped, with the reason.
3. The Triton kernels (paged decode attention, `course_lib.accel.triton_paged`; INT8/INT4 matmuls) against their
   PyTorch twins (`course_lib.attention.paged.paged_decode_attention`; the checks of tests/test_quant_triton.py),
   on the GPU (with --cpu, in Triton's interpreter, float32 and float16). On the GPU also `pytest -m cuda`.
4. Speed, side by side in one run, in the policy's dtype: batch-1 decode for the engine (`accel=True`) and for
   `transformers` `generate`, with the GB/s it implies and its share of the measured bandwidth roof;
   throughput of 32 and 128 requests submitted at once (engine: continuous batching; transformers:
   one padded batch). On CUDA the engine runs twice, CUDA graphs on (its default) and off
   (`enforce_eager=True`, where `LLM` has it). Then batch-1 decode in float16, the engine against its own
   INT4 (`quantization="int4"`) and `transformers`, on the Llama-3.2-1B shape.
The exit status is 1 when any check fails.
"""
from __future__ import annotations

import argparse
import copy
import gc
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

from benchmarks.compare import OFFLINE_BATCHED_TOKENS, EngineSystem, TransformersSystem, Workload, measure_systems
from course_lib import LLM, SamplingParams, load_tokenizer
from course_lib.attention.paged import paged_decode_attention
from course_lib import load_model
from course_lib.chapter import GPU_MODEL, hub_reachable, processor_name, quiet_libraries
from course_lib.config import ModelConfig
from course_lib.dtypes import default_dtype, resolve_device
from course_lib.loading import build_model
from course_lib.profiling.memory import weight_bytes
from course_lib.profiling.roofline import Ceilings, measure_bandwidth, measure_matmul_flops

SHAPES = {  # Hugging Face config.json fields of the real models; the weights are random
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
CPU_SIZES = {  # --cpu: the same shapes cut to 2 layers, the 1B one also narrowed (heads of 64 kept)
    "smollm2-135m": dict(num_hidden_layers=2),
    "llama-3.2-1b": dict(num_hidden_layers=2, hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                         num_key_value_heads=2),
}
# max |engine logit - reference logit| / max |reference logit|; the same fraction of the largest logit is how
# close a greedy choice may be to the reference's best and still count as a tie broken by rounding
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}
PROMPT_TOKENS, GREEDY_TOKENS = 48, 24
INT4_SHAPE = "llama-3.2-1b"  # INT4 against float16: the shape whose decode reads the most weight bytes
REAL_PROMPTS = (  # prose, code, a chat question and Chinese: real text is where large activations show
    "The history of the printing press begins in the fifteenth century, when",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    "Explain in two sentences why a KV cache makes decoding faster.",
    "很久很久以前，在一座山上有一座庙，",
)
FLOAT16_MAX = torch.finfo(torch.float16).max  # 65504
REAL_MAX_ACTIVATION = 0.5  # of FLOAT16_MAX: a factor of two of headroom
REAL_TOP1 = 0.95  # the share of positions where float16's top token is float32's


@dataclass
class Check:
    section: str
    name: str
    passed: bool
    value: float | None = None
    tolerance: float | None = None
    detail: str = ""


@dataclass
class Report:
    env: dict
    checks: list[Check] = field(default_factory=list)
    speed: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # checks this machine cannot run, each with its reason

    def skip(self, section: str, name: str, reason: str) -> None:
        self.skipped.append({"section": section, "name": name, "reason": reason})
        print(f"  SKIP {name}: {reason}", flush=True)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        value = "" if check.value is None else f" {check.value:.2e}"
        limit = "" if check.tolerance is None else f" (tolerance {check.tolerance:.0e})"
        print(f"  {'PASS' if check.passed else 'FAIL'} {check.name}:{value}{limit} {check.detail}", flush=True)


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def guarded(report: Report, name: str, run, *args) -> None:
    """run(*args); an exception becomes a failed check and the rest of the run goes on (a GPU session is short)."""
    try:
        run(*args)
    except Exception as e:
        report.add(Check("error", name, False, detail=f"{type(e).__name__}: {e}"[:500]))
        traceback.print_exc()
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def environment(device: torch.device) -> dict:
    import transformers

    env = {"device": str(device), "name": processor_name(device), "policy_dtype": str(default_dtype(device)),
           "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "threads": torch.get_num_threads()}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(capability=f"{props.major}.{props.minor}", memory_gb=round(props.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    for key, value in env.items():
        print(f"  {key}: {value}")
    return env


def random_pair(shape: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """transformers' LlamaForCausalLM with random weights, and the engine's model on the very same tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(device):
        hf = LlamaForCausalLM(cfg)
    with torch.no_grad():  # random but not flat: norms off 1 so every parameter matters, a peaked output
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    hf = hf.to(dtype).eval().requires_grad_(False)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    engine = build_model(ModelConfig.from_hf(cfg.to_dict(), name="random"), state, device, dtype)
    return hf, engine


@torch.inference_mode()
def check_against_transformers(report: Report, label: str, hf, model, tokenizer, dtype: torch.dtype) -> None:
    """Logits of one prompt, then greedy tokens through the engine's paged cache, against the reference."""
    device, tol = model.device, TOLERANCE[dtype]
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, min(model.config.vocab_size, 32000), (PROMPT_TOKENS,), generator=gen).tolist()
    x = torch.tensor([ids], device=device)
    ref = hf(x).logits.float()
    scale = ref.abs().max().item()
    diff = (model(x).float() - ref).abs().max().item() / scale
    report.add(Check("transformers", f"{label} logits", diff <= tol, diff, tol, f"(max |logit| {scale:.2f})"))

    llm = LLM.from_model(model, tokenizer, enable_prefix_caching=False,  # a small cache: not a share of the GPU
                         kv_cache_memory=model.config.kv_bytes_per_token(dtype) * 16 * (PROMPT_TOKENS + GREEDY_TOKENS))
    out = llm.generate([ids], SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0, ignore_eos=True))[0]
    ours = out.outputs[0].token_ids
    steps = hf(torch.tensor([ids + ours[:-1]], device=device)).logits[0, len(ids) - 1:].float()  # [n, vocab]
    best = steps.max(-1).values
    short = (best - steps[torch.arange(len(ours)), torch.tensor(ours, device=device)]) / scale  # 0 when identical
    identical = next((i for i, (a, b) in enumerate(zip(ours, steps.argmax(-1).tolist())) if a != b), len(ours))
    top2 = steps.topk(2, -1).values
    margin = ((top2[:, 0] - top2[:, 1]) / scale).median().item()
    report.add(Check("transformers", f"{label} greedy", bool((short <= tol).all()), short.max().item(), tol,
                     f"({identical}/{len(ours)} tokens the reference's argmax; median top-2 gap {margin:.1e})"))
    del llm


def real_weights_skip_reason(device: torch.device) -> str:
    """Why the real-weights check cannot run here ("" when it can): it needs CUDA, then the Hub."""
    if device.type != "cuda":
        return f"no GPU: {GPU_MODEL} in float16 against float32 runs on CUDA only"
    if not hub_reachable():
        return f"no network: the Hugging Face Hub does not answer (or HF_HUB_OFFLINE is set) to download {GPU_MODEL}"
    return ""


@torch.inference_mode()
def largest_activations(model, ids: torch.Tensor) -> tuple[torch.Tensor, float, str]:
    """(logits [1, seq, vocab] in float32, the largest |value| any module outputs, that module's name)."""
    seen = {"value": 0.0, "where": ""}

    def record(name):
        def hook(module, args, out):
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                value = out.abs().max().float().item()  # inf where float16 overflowed
                if not value <= seen["value"]:  # also takes inf and NaN
                    seen.update(value=value, where=name)
        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if n]
    try:
        logits = model(ids).float()  # [1, seq, vocab]
    finally:
        for h in handles:
            h.remove()
    return logits, seen["value"], seen["where"]


def real_weights_float16(report: Report, device: torch.device) -> None:
    """GPU_MODEL from the Hub in float32, then in float16, on REAL_PROMPTS: the largest activation of float16 as a
    fraction of FLOAT16_MAX, and top-1 agreement with float32 over every prompt position."""
    name = f"{GPU_MODEL} float16"
    reason = real_weights_skip_reason(device)
    if reason:
        for what in ("max activation", "top-1 agreement"):
            report.skip("real weights", f"{name} {what}", reason)
        return
    tokenizer = load_tokenizer(GPU_MODEL)
    prompts = [torch.tensor([tokenizer.encode(p)], device=device) for p in REAL_PROMPTS]  # [1, seq] each
    model = load_model(GPU_MODEL, device, torch.float32)
    want = [largest_activations(model, ids)[0] for ids in prompts]  # float32 first, then freed: a T4 holds one
    del model
    gc.collect()
    torch.cuda.empty_cache()
    model = load_model(GPU_MODEL, device, torch.float16)
    largest, where, same, positions = 0.0, "", 0, 0
    for ids, ref in zip(prompts, want):
        logits, value, module = largest_activations(model, ids)
        if not value <= largest:
            largest, where = value, module
        same += (logits.argmax(-1) == ref.argmax(-1)).sum().item()
        positions += ids.shape[1]
    del model
    fraction = largest / FLOAT16_MAX
    report.add(Check("real weights", f"{name} max activation", fraction <= REAL_MAX_ACTIVATION, fraction,
                     REAL_MAX_ACTIVATION, f"(of float16's {FLOAT16_MAX:.0f}: {largest:.1f} at {where or '-'})"))
    agree = same / positions
    report.add(Check("real weights", f"{name} top-1 agreement", agree >= REAL_TOP1, agree, REAL_TOP1,
                     f"({same}/{positions} positions of {len(prompts)} prompts; at least the tolerance)"))


def check_triton(report: Report, device: torch.device, dtype: torch.dtype) -> None:
    """The Triton kernels against PyTorch on `device`; a mismatch (or no triton) fails that check only."""
    from tests.test_paged_attention import check_triton_against_torch as check_paged
    from tests.test_quant_triton import check_triton_against_torch as check_quant

    dev = device.type
    # triton's interpreter computes tl.dot on bfloat16 blocks wrongly (numpy has no bfloat16): float16 there
    low = torch.float16 if dev == "cpu" else dtype
    cases = [("paged decode attention float32 (relative)", lambda: check_paged(dev), 1e-3),
             (f"paged decode attention {low} (relative)", lambda: check_paged(dev, low, rtol=2e-2), 2e-2),
             ("INT8/INT4 matmul float32 (relative)", lambda: check_quant(dev), 1e-4),
             (f"INT8/INT4 matmul {low} (relative)", lambda: check_quant(dev, low, rtol=2e-2), 2e-2)]
    for name, run, tol in cases:
        guarded(report, name, lambda: report.add(Check("triton", name, True, run(), tol)))


def run_cuda_tests(report: Report) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=240)  # a timeout is reported by `guarded`
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    report.add(Check("pytest", "pytest -m cuda", proc.returncode == 0, detail=tail))
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:])


def graphs_switch() -> bool:
    """Whether `LLM` can turn CUDA graphs off (`enforce_eager`), so the speed runs both ways."""
    return any("enforce_eager" in inspect.signature(f).parameters for f in (LLM.__init__, LLM.from_model))


def engine_systems(model, tokenizer, dtype: torch.dtype, work: Workload, quantization: str | None = None,
                   eager_too: bool = True) -> list:
    """The engine (`accel=True`) on its own copy of `model`; on CUDA and with `eager_too`, also with graphs off."""
    config = model.config
    tokens = max(work.concurrency, default=1) * (128 + 16 + max(work.uniform_output, work.decode_tokens))
    options = dict(accel=True, enable_prefix_caching=False, max_num_seqs=max(work.concurrency, default=1),
                   max_num_batched_tokens=OFFLINE_BATCHED_TOKENS, quantization=quantization,
                   kv_cache_memory=config.kv_bytes_per_token(dtype) * (tokens + work.prompt_tokens + 64))
    name = "engine" if quantization is None else f"engine {quantization}"
    variants = {name: {}}
    if eager_too and model.device.type == "cuda" and graphs_switch():
        variants[f"{name} eager"] = {"enforce_eager": True}
    systems = []
    for label, extra in variants.items():  # accel and quantization change the model in place: a copy each
        system = EngineSystem(LLM.from_model(copy.deepcopy(model), tokenizer, **options, **extra), label)
        system.weight_bytes = weight_bytes(system.llm.model)
        if quantization is not None:
            system.precision = quantization
        systems.append(system)
    return systems


def measure_speed(report: Report, run: str, shape: str, hf, model, tokenizer, dtype: torch.dtype, work: Workload,
                  ceilings: Ceilings, quantization: str | None = None) -> None:
    """Batch-1 decode and throughput at each concurrency, engine (`accel=True`) and transformers, same weights;
    with `quantization`, the engine in float and quantized, graphs on only."""
    precision = str(dtype).removeprefix("torch.")
    systems = engine_systems(model, tokenizer, dtype, work, eager_too=quantization is None)
    if quantization is not None:
        systems += engine_systems(model, tokenizer, dtype, work, quantization, eager_too=False)
    systems.append(TransformersSystem(hf))
    print(f"  {', '.join(s.name for s in systems)}: {shape} {precision}, taking turns ...", flush=True)
    for r in measure_systems(systems, precision, work, tokenizer, model.config, ceilings, weight_bytes(model)):
        report.speed.append({"run": run, "shape": shape, **asdict(r)})
    del systems


def ceilings_for(report: Report, state: dict, device: torch.device, dtype: torch.dtype) -> Ceilings:
    """The matmul and bandwidth roofs in `dtype`, measured once."""
    name = str(dtype).removeprefix("torch.")
    if name not in state["ceilings"]:
        c = state["ceilings"][name] = Ceilings(measure_matmul_flops(device, dtype), measure_bandwidth(device, dtype),
                                               str(device), name)
        report.env.setdefault("ceilings", {})[name] = asdict(c)
        print(f"  ceilings, {name}: {c.peak_flops / 1e12:.2f} TFLOP/s matmul, {c.bandwidth / 1e9:.0f} GB/s copy")
    return state["ceilings"][name]


def check_shape(report: Report, state: dict, shape_name: str, shape: dict, device: torch.device, dtype: torch.dtype,
                tokenizer, work: Workload, speed: bool) -> None:
    """One shape in one dtype: the checks against transformers, then (in the policy's dtype) the speed table."""
    section(f"{shape_name} (random weights): engine vs transformers, {device} {dtype}")
    hf, model = random_pair(shape, device, dtype)
    check_against_transformers(report, f"{shape_name} {str(dtype).removeprefix('torch.')}", hf, model, tokenizer, dtype)
    if not speed:
        return
    ceilings = ceilings_for(report, state, device, dtype)
    section(f"{shape_name}: speed, {device} {dtype}")
    measure_speed(report, str(dtype).removeprefix("torch."), shape_name, hf, model, tokenizer, dtype, work, ceilings)


def int4_against_float16(report: Report, state: dict, shape_name: str, shape: dict, device: torch.device,
                         tokenizer, work: Workload) -> None:
    """Batch-1 decode in float16: the engine, its INT4 twin and transformers (a T4's dtype on any GPU)."""
    section(f"{shape_name}: INT4 against float16, batch-1 decode, {device}")
    hf, model = random_pair(shape, device, torch.float16)
    ceilings = ceilings_for(report, state, device, torch.float16)
    decode_only = Workload(decode_tokens=work.decode_tokens, prompt_tokens=work.prompt_tokens, concurrency=(),
                           repeats=work.repeats, ttft_repeats=1, output_kinds=())
    measure_speed(report, "int4 vs float16", shape_name, hf, model, tokenizer, torch.float16, decode_only, ceilings,
                  quantization="int4")


def print_speed(report: Report, work: Workload) -> None:
    """One row per system and shape, and the ratios issue 14 asks for; then INT4 against float16."""
    by = {(r["run"], r["shape"], r["system"], r["metric"]): r for r in report.speed}
    cols = ["decode_tok_s"] + [f"throughput_{c}_uniform" for c in work.concurrency]
    print(f"{'run':<17}{'shape':<14}{'system':<18}{'batch-1 decode tok/s':>34}"
          + "".join(f"{f'{c} requests tok/s':>20}" for c in work.concurrency))
    for run, shape in dict.fromkeys((r["run"], r["shape"]) for r in report.speed):
        for system in dict.fromkeys(r["system"] for r in report.speed if (r["run"], r["shape"]) == (run, shape)):
            cells = []
            for metric in cols:
                r = by.get((run, shape, system, metric))
                if r is None:
                    cells.append("—")
                elif "of_bandwidth" in r["extra"]:
                    cells.append(f"{r['value']:.1f} ({r['extra']['GB/s']:.0f} GB/s, {r['extra']['of_bandwidth']:.0%})")
                else:
                    cells.append(f"{r['value']:.1f}")
            print(f"{run:<17}{shape:<14}{system:<18}{cells[0]:>34}" + "".join(f"{c:>20}" for c in cells[1:]))
        hf = by.get((run, shape, "transformers", "decode_tok_s"))
        for system in ("engine", "engine eager", "engine int4"):
            eng = by.get((run, shape, system, "decode_tok_s"))
            top = by.get((run, shape, system, f"throughput_{max(work.concurrency)}_uniform"))
            if hf and eng:
                line = f"{system} / transformers batch-1 decode: {eng['value'] / hf['value']:.2f}x"
                line += " (target 3x, with graphs)" if system == "engine" and top else ""
                if top:
                    line += (f"; {max(work.concurrency)} requests / transformers batch-1: "
                             f"{top['value'] / hf['value']:.1f}x" + (" (target 10x)" if system == "engine" else ""))
                print(f"{'':<17}{line}")
        f16, int4 = by.get((run, shape, "engine", "decode_tok_s")), by.get((run, shape, "engine int4", "decode_tok_s"))
        if f16 and int4:
            print(f"{'':<17}engine int4 / float16 batch-1 decode: {int4['value'] / f16['value']:.2f}x")


def cuda_graphs_note(device: torch.device) -> str:
    if device.type != "cuda":
        return "none on the CPU (enforce_eager changes nothing there)"
    if graphs_switch():
        return "on and off: 'engine' runs CUDA graphs (the default), 'engine eager' runs enforce_eager=True"
    return "not compared: this LLM has no enforce_eager, so every engine row runs its default"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="the same checks at small sizes on the CPU (for CI)")
    ap.add_argument("--json", default=None, help="write every check and figure to this file")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args(argv)
    if args.cpu:  # Triton reads this once, when it is first imported (course_lib imports it lazily)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    quiet_libraries()
    start = time.perf_counter()
    device = torch.device("cpu") if args.cpu else resolve_device("cuda")
    policy = default_dtype(device)

    section("machine")
    report = Report(environment(device))
    tokenizer = load_tokenizer()
    if args.cpu:
        work = Workload(decode_tokens=8, prompt_tokens=32, concurrency=(4, 16), uniform_output=4, repeats=1,
                        ttft_repeats=1, output_kinds=("uniform",))  # a rehearsal of the code, not a measurement
    else:
        work = Workload(decode_tokens=64, prompt_tokens=512, concurrency=(32, 128), uniform_output=128, repeats=3,
                        output_kinds=("uniform",))
    state = {"ceilings": {}}
    shapes = {name: {**shape, **(CPU_SIZES[name] if args.cpu else {})} for name, shape in SHAPES.items()}
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        dtypes.pop()  # a T4: no native bfloat16, and the policy never picks it there
        print("  (no native bfloat16 on this GPU: its checks are skipped)")
    for shape_name, shape in shapes.items():
        for dtype in dtypes:
            guarded(report, f"{shape_name} {dtype}", check_shape, report, state, shape_name, shape, device, dtype,
                    tokenizer, work, dtype == policy and not args.skip_speed)
    if not args.skip_speed:
        guarded(report, "INT4 against float16", int4_against_float16, report, state, INT4_SHAPE,
                shapes[INT4_SHAPE], device, tokenizer, work)

    section(f"Triton kernels vs PyTorch, {device}" + (" (interpreter)" if args.cpu else ""))
    guarded(report, "Triton kernels", check_triton, report, device, policy)
    if device.type == "cuda":
        guarded(report, "pytest -m cuda", run_cuda_tests, report)
    section("real weights in float16" + ("" if device.type == "cuda" else " (a GPU check)"))
    guarded(report, "real weights in float16", real_weights_float16, report, device)
    if report.speed:
        section("speed")
        print_speed(report, work)
        if args.cpu:
            print("(--cpu: these small models stay in the CPU's caches, so a fraction of the copy bandwidth above "
                  "100% is possible; the ratios are what the GPU run is for)")
    failed = [c for c in report.checks if not c.passed]
    seconds = time.perf_counter() - start
    print(f"\ngpu_check: {len(report.checks) - len(failed)}/{len(report.checks)} checks passed in {seconds:.0f} s"
          + (f", {len(report.skipped)} skipped (SKIP above says why)" if report.skipped else "")
          + "".join(f"\n  FAILED {c.name}" for c in failed))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"env": report.env, "checks": [asdict(c) for c in report.checks], "speed": report.speed,
                       "skipped": report.skipped,
                       "cuda_graphs": cuda_graphs_note(device),
                       "workload": asdict(work), "seconds": seconds, "passed": not failed}, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
