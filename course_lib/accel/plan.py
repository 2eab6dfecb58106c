"""What `LLM(accel=True)` runs on this machine: decided once, in one small object (`plan_for`), printed by
`python -m course_lib.accel`.

Every choice follows from what this machine has (the device, oneDNN's kernels for the dtype) and what the C++
build gave (`build.py`); none from a CPU's maker or name. The one number that differs from machine to machine,
how many rows the panels serve better than oneDNN, is measured here once per machine and dtype
(`measure_panel_rows`) and kept beside the build.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..chapter import processor_name
from ..dtypes import dtype_name, resolve_device_dtype, resolve_dtype
from .linear import onednn_has_kernels

PANEL_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # the row counts `measure_panel_rows` tries, in order
W4A8_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # the row counts `measure_w4a8_rows` tries, in order
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in): the default model's fused layer


def check_triton_dtype(device: torch.device | str, dtype: torch.dtype) -> None:
    """Refuse bfloat16 where the engine would run Triton kernels (attention, quantized layers, `torch.compile`) on
    an NVIDIA GPU below compute capability 8.0, such as a T4: it has no bfloat16 arithmetic, so Triton emulates
    it, untested by this course's CUDA tests and by Triton, whose maintainers no longer fix sm75 (triton issue
    #10918). float16, this GPU's default, runs the same kernels natively."""
    device = torch.device(device)
    if dtype != torch.bfloat16 or device.type != "cuda" or torch.version.hip:
        return
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise ValueError(f"dtype bfloat16 with Triton kernels needs an NVIDIA GPU of compute capability 8.0 or "
                         f"later; this one is {major}.{minor}, which has no bfloat16 arithmetic. Use "
                         f"dtype='float16' (the default on this GPU), or the reference engine (accel=False).")


@dataclass(frozen=True)
class Plan:
    """The kernels `accel` applies. Each field can be turned off on its own (`dataclasses.replace`), which is
    how `benchmarks/accel_ablation.py` measures what each one gains."""

    device: str
    dtype: torch.dtype
    fused_blocks: bool = True  # q/k/v one matmul, gate/up one matmul (`fused_model.py`)
    fused_ops: bool = False  # RMSNorm, residual add, RoPE, SiLU*up in one C++ pass each (eager CPU steps)
    packed_linears: bool = False  # every plain linear layer's weight packed once by oneDNN (CPU)
    panel_rows: int = 0  # and steps of 1 to panel_rows rows through panels (C++)
    w4a8_rows: int = 0  # INT4 layers (groups of 32): steps of 1 to w4a8_rows rows through the W4A8 kernel (C++)
    w4a8_path: str = ""  # its widest instruction-set path here ("avx512vnni", "avxvnni", "avx2", "scalar")
    attention: str = "torch"  # "cpp": every query row through the C++ kernel; "triton": decode rows (CUDA)
    quant_kernels: str = "torch"  # quantized layers: "onednn" (CPU) or "triton" (CUDA) kernels (`quant_linear.py`)
    cpp_decode: bool = False  # decode steps' layers in one C++ call of the kernels above (`cpp_decode.py`)
    compile_decode: bool = False  # decode steps through one torch.compile'd graph (`compiled_decode.py`)
    cuda_graphs: bool = False  # decode steps replayed as CUDA graphs, one per batch-size bucket (`cuda_graphs.py`)
    problems: tuple[str, ...] = field(default=(), compare=False)  # what could not be built or used, and why

    @property
    def needs_kernels(self) -> bool:
        """Whether the plan calls the C++ extension (which `plan_for` has built by then)."""
        return self.fused_ops or self.panel_rows > 0 or self.w4a8_rows > 0 or self.attention == "cpp"

    def describe(self) -> str:
        """The plan as a table: which kernel serves which part of the model, for which row counts."""
        dtype = dtype_name(self.dtype)
        if self.packed_linears and self.panel_rows:
            linear = (f"1-{self.panel_rows} rows: C++ panels (the rows where they beat oneDNN, measured here); "
                      f"more: oneDNN packed weights ({dtype})")
        elif self.packed_linears:
            linear = f"oneDNN packed weights, any rows ({dtype})"
        else:
            linear = "F.linear (PyTorch)"
        attention = {"cpp": "C++ paged kernel: decode and prompt tokens, one call a layer",
                     "triton": "Triton paged kernel for decode rows; prompts through SDPA",
                     "torch": "PyTorch (gather + SDPA), as the reference"}[self.attention]
        if self.cuda_graphs:
            decode = ("CUDA graphs, one per batch-size bucket (enforce_eager=True turns them off)" +
                      ("; compile_decode unused there" if self.compile_decode else ""))
        else:
            decode = ("torch.compile'd graph (compile_decode=True)" if self.compile_decode else
                      "every layer in one C++ call, no Python between the kernels" if self.cpp_decode else "eager")
        rows = [
            ("machine", f"{processor_name(torch.device(self.device))} ({platform.machine()}, "
                        f"{torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads, "
                        f"torch {torch.__version__}, {self.device} {dtype}"),
            ("q/k/v, gate/up", "one matmul each (fused blocks)" if self.fused_blocks else "separate (reference)"),
            ("linear layers", linear + ("; quantized layers keep their own kernels" if self.packed_linears else "")),
            ("INT4 layers (g32)", f"1-{self.w4a8_rows} rows: W4A8 kernel, int8 activations ({self.w4a8_path}); "
                                  "more: PyTorch's INT4 op" if self.w4a8_rows else "PyTorch's INT4 op (bfloat16 activations)"),
            ("RMSNorm, RoPE, SiLU", "C++, one pass each (eager steps)" if self.fused_ops else "PyTorch"),
            ("quantized layers", {"onednn": "PyTorch's packed INT8/INT4 CPU ops (oneDNN), bfloat16 from many rows",
                                  "triton": "Triton kernels, dequantizing inside the matmul",
                                  "torch": "dequantize, then F.linear (PyTorch)"}[self.quant_kernels]),
            ("attention", attention),
            ("decode step", decode),
        ]
        rows += [("not used", problem) for problem in self.problems]
        return "\n".join(f"  {name:<20} {what}" for name, what in rows)


def plan_for(device: torch.device | str | None = None, dtype: torch.dtype | str | None = None,
             compile_decode: bool = False, enforce_eager: bool = False) -> Plan:
    """What this machine supports for a model on `device` in `dtype`. On the CPU this builds the C++ kernels
    first if the cache lacks them (once per machine, about a minute); a failed build warns once and leaves
    them out. On CUDA decode steps run as CUDA graphs unless `enforce_eager=True` (vLLM's name);
    the graphs need the Triton kernel, whose loop stops at each sequence's length (PyTorch's paged attention
    would gather every sequence's longest possible context in a graph of fixed shapes)."""
    from .build import build

    device, dtype = resolve_device_dtype(device, dtype)
    problems = []
    if device.type == "cuda":
        triton = importlib.util.find_spec("triton") is not None
        if not triton:
            problems.append("Triton is not installed: decode attention stays in PyTorch, decode steps eager")
        return Plan("cuda", dtype, attention="triton" if triton else "torch", compile_decode=compile_decode,
                    quant_kernels="triton" if triton else "torch", cuda_graphs=not enforce_eager and triton,
                    problems=tuple(problems))
    built = build()
    ops = built.module
    if ops is None:
        problems.append(f"C++ kernels: {built.problem}")
    packed = torch.backends.mkldnn.is_available() and (dtype == torch.float32 or onednn_has_kernels(dtype))
    if not packed:
        problems.append(f"oneDNN packed weights: this CPU's oneDNN has no {dtype_name(dtype)} kernels")
    if packed and compile_decode and ops is None:
        packed = False  # a compiled graph reaches a packed weight only through the extension's operator
        problems.append("oneDNN packed weights in a compiled graph: need the C++ kernels")
    width = ops.panel_width.get(dtype_name(dtype), 0) if ops is not None else 0
    if ops is not None and packed and not width:
        problems.append(f"panels for {dtype_name(dtype)}: none on this CPU (bfloat16 needs AVX512-BF16)")
    rows = panel_rows(ops, dtype) if packed and width else 0
    if packed and width and not rows:
        problems.append(f"panels for {dtype_name(dtype)}: oneDNN was as fast at one row, measured here")
    w4a8 = w4a8_rows(ops, problems) if ops is not None and torch.backends.mkldnn.is_available() else 0
    return Plan("cpu", dtype, fused_ops=ops is not None, packed_linears=packed,
                panel_rows=rows, w4a8_rows=w4a8, w4a8_path=ops.w4a8_paths()[-1] if w4a8 else "",
                attention="cpp" if ops is not None else "torch", quant_kernels="onednn",
                cpp_decode=ops is not None and not compile_decode, compile_decode=compile_decode,
                problems=tuple(problems))


def panel_rows(ops, dtype: torch.dtype) -> int:
    """Up to how many rows the panels beat oneDNN here: measured once per machine and dtype, then read back."""
    from .build import build_directory

    path = build_directory() / "panel_rows.json"
    key = f"{dtype_name(dtype)}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    known = _read_json(path)
    if key not in known:
        known[key] = measure_panel_rows(ops, dtype)
        path.write_text(json.dumps(known, indent=1), encoding="utf-8")
    return known[key]


def _read_json(path) -> dict:
    """What a file of measurements beside the build holds ({} if none or unreadable: measure again)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def load_per_core() -> float:
    """The 1-minute load average per core (0 where the OS does not say): above 1, other work shares the cores and
    a timing taken now says more about it than about the kernels."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 0.0


def w4a8_rows(ops, problems: list[str]) -> int:
    """Up to how many rows the W4A8 kernel beats PyTorch's INT4 op here: measured once per machine, then read back;
    measured again when a figure taken on a busy machine (`load_per_core` > 1) can be replaced by one on a quiet one."""
    from .build import build_directory

    path = build_directory() / "w4a8_rows.json"
    key = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    known = _read_json(path)
    busy = load_per_core()
    if key not in known or (known[key]["busy"] > 1 and busy <= 1):
        known[key] = {"rows": measure_w4a8_rows(ops), "busy": round(busy, 2)}
        path.write_text(json.dumps(known, indent=1), encoding="utf-8")
    if known[key]["busy"] > 1:
        problems.append(f"W4A8 rows ({known[key]['rows']}) measured on a busy machine ({known[key]['busy']:.1f} "
                        "runnable tasks a core): measured again once it is quiet")
    return known[key]["rows"]


@torch.inference_mode()
def measure_w4a8_rows(ops, megabytes: int = 48, rounds: int = 3) -> int:
    """The largest row count of `W4A8_ROWS` up to which the W4A8 kernel multiplies the default model's layer shapes
    (`megabytes` of INT4 weights, more than the caches hold, at few rows) at least as fast as PyTorch's INT4 op
    (bfloat16 x), the two taking turns; 0 if not at one row. Seconds."""
    from .quant_linear import onednn_problem, use_quant_kernels
    from .w4a8 import W4A8PackedLinear

    if onednn_problem("int4", 576, 576, 32):  # nothing to compare with: the kernel serves every decode row
        return W4A8_ROWS[-1]
    per_layer = sum(n * k for n, k in LAYER_SHAPES) * 5 // 8  # Q4_1: 5 bits a weight
    generator = torch.Generator().manual_seed(0)
    layers = [use_quant_kernels(W4A8PackedLinear(torch.nn.Linear(k, n, bias=False), ops, W4A8_ROWS[-1]), "onednn")
              for n, k in LAYER_SHAPES * max(1, megabytes * 2**20 // per_layer)]  # fallback: the INT4 op
    best = 0
    for rows in W4A8_ROWS:
        used = layers[:len(LAYER_SHAPES) * (1 if rows >= 64 else len(layers))]  # compute-bound: a few layers
        xs = {k: torch.randn(rows, k, generator=generator).to(torch.bfloat16) for _, k in LAYER_SHAPES}
        times = {"int4 op": [], "w4a8": []}
        for r in range(rounds + 1):  # a warm-up round, then the two take turns
            for name in times:
                t = time.perf_counter()
                for layer in used:
                    (layer.fallback if name == "int4 op" else layer)(xs[layer.in_features])
                if r:
                    times[name].append(time.perf_counter() - t)
        if statistics.median(times["int4 op"]) < statistics.median(times["w4a8"]):
            break
        best = rows
    return best


@torch.inference_mode()
def measure_panel_rows(ops, dtype: torch.dtype, megabytes: int = 256, rounds: int = 3) -> int:
    """The largest row count of `PANEL_ROWS` up to which the panels multiply layers of the default model's shapes
    (`megabytes` of weights, more than a core's caches hold, as in a decode step) at least 1.1x as fast as oneDNN's
    packed weights, the two taking turns; 0 if not at one row. A few seconds."""
    from .linear import PackedLinear

    per_layer = sum(n * k for n, k in LAYER_SHAPES) * torch.tensor([], dtype=dtype).element_size()
    shapes = LAYER_SHAPES * max(1, megabytes * 2**20 // per_layer)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=generator).to(dtype) for n, k in shapes]
    packed, panels = [], [ops.pack_panels(w) for w in weights]
    for w in weights:
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=dtype)
        linear.weight.data = w
        packed.append(PackedLinear(linear))
    best = 0
    for rows in PANEL_ROWS:
        xs = {k: torch.randn(rows, k, generator=generator).to(dtype) for _, k in shapes}
        times = {"onednn": [], "panels": []}
        for r in range(rounds + 1):  # a warm-up round, then the two take turns
            for name in times:
                t = time.perf_counter()
                for i, (_, k) in enumerate(shapes):
                    packed[i](xs[k]) if name == "onednn" else ops.by_panels(xs[k], panels[i])
                if r:
                    times[name].append(time.perf_counter() - t)
        if statistics.median(times["onednn"]) < 1.1 * statistics.median(times["panels"]):
            break
        best = rows
    return best
