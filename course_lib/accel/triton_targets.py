"""The engine's Triton kernels compiled for the cards learners have, on a machine with no GPU.

Triton compiles for a card named by its compute capability, `GPUTarget("cuda", 80, 32)`, whether or not one
is present: Python to Triton IR to LLVM to PTX, then the `ptxas` that ships in Triton's wheel to a cubin. So a
CPU can check what a T4, A100, L4 or H100 would be handed: that each kernel compiles, that its matmuls use the
tensor cores (`mma` in the PTX), that no register spills to local memory, and that its shared memory fits.

The launches are not described twice. `record_launch` calls the engine's own wrapper (the function the engine
calls, with CPU tensors of the engine's shapes and dtypes) and catches the arguments where the wrapper launches
its kernel; `compile_launch` turns them into a signature, constants and options exactly as `JITFunction.run`
does on a GPU, then compiles. A wrapper that changes its block sizes or dtypes changes what is compiled here.

    python -m course_lib.accel.triton_targets      prints the table for the default model's launches
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from types import ModuleType
from typing import Callable
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature


@dataclass(frozen=True)
class Card:
    """A GPU a learner may have: its compute capability and the shared memory one block may opt in to."""

    name: str
    capability: int  # 75 for 7.5
    max_shared_per_block: int  # bytes; CUDA C++ Programming Guide, "technical specifications per compute capability"

    @property
    def has_bfloat16(self) -> bool:
        return self.capability >= 80


CARDS = (
    Card("T4", 75, 64 * 1024),
    Card("A100", 80, 163 * 1024),  # 164 KiB a multiprocessor, 1 KiB of it kept by the system
    Card("L4", 89, 99 * 1024),  # 100 KiB a multiprocessor
    Card("H100", 90, 227 * 1024),  # 228 KiB a multiprocessor
)


@dataclass(frozen=True)
class Launch:
    """One kernel launch as the wrapper made it: the JIT function and its arguments."""

    kernel: JITFunction
    args: tuple
    kwargs: dict


def record_launch(module: ModuleType, kernel_name: str, call: Callable[[], object]) -> Launch:
    """Run `call` (which calls a wrapper in `module`) and catch the launch of `module.<kernel_name>` instead of
    running it; every other kernel of `module` the wrapper launches (a second pass, as the split decode's combine)
    is caught too and dropped. The wrappers refuse CPU tensors unless Triton interprets, so TRITON_INTERPRET=1 is
    set for the call: nothing is interpreted, since no kernel is launched."""
    kernel = getattr(module, kernel_name)
    if not isinstance(kernel, JITFunction):
        raise RuntimeError(f"{kernel_name} is not compiled by Triton here (TRITON_INTERPRET was set at import)")
    caught: list[Launch] = []

    class Catch:
        def __init__(self, name: str):
            self.name = name

        def __getitem__(self, grid):
            keep = self.name == kernel_name
            return lambda *args, **kwargs: caught.append(Launch(kernel, args, kwargs)) if keep else None

    jitted = [name for name, value in vars(module).items() if isinstance(value, JITFunction)]
    with contextlib.ExitStack() as stack:
        for name in jitted:
            stack.enter_context(mock.patch.object(module, name, Catch(name)))
        stack.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
        call()
    if len(caught) != 1:
        raise RuntimeError(f"expected one launch of {kernel_name}, caught {len(caught)}")
    return caught[0]


@dataclass(frozen=True)
class Compiled:
    """What a card would be given: the kernel's PTX and the resources `ptxas` reports for it."""

    ptx: str
    has_dot: bool  # whether the kernel multiplies tiles with `tl.dot` (`tt.dot` in its Triton IR)
    registers: int  # a thread
    spill_bytes: int  # stores + loads to local memory; 0 when everything fits in registers
    shared_bytes: int  # the dynamic shared memory a launch requests
    num_warps: int

    @property
    def tensor_core_op(self) -> str:
        """The PTX matmul instruction on tensor cores ("mma.sync", "wgmma.mma_async"), or "" for none."""
        found = re.search(r"\b(wgmma\.mma_async|mma\.sync)", self.ptx)
        return found.group(1) if found else ""


def compile_launch(launch: Launch, capability: int) -> Compiled:
    """Compile a recorded launch for compute capability `capability`, as `JITFunction.run` would on that card."""
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    kernel = launch.kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, launch.kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    ptx = compiled.asm["ptx"]
    registers, spills = ptxas_usage(ptx, capability)
    return Compiled(ptx, "tt.dot" in compiled.asm["ttir"], registers, spills, compiled.metadata.shared,
                    compiled.metadata.num_warps)


def ptxas_usage(ptx: str, capability: int) -> tuple[int, int]:
    """(registers a thread, spill bytes) from `ptxas -v`, run as Triton runs it. Triton drops this log when it
    builds the cubin (and a kernel's `n_spills` is filled only when loaded on a GPU), so it is run once more."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w", encoding="utf-8") as f:
            f.write(ptx)
        cmd = [get_ptxas(capability).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
               f"--gpu-name={sm_arch_from_capability(capability)}", src, "-o", os.path.join(tmp, "kernel.cubin")]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return registers, spills


def engine_launches(dtype: torch.dtype) -> dict[str, Launch]:
    """The launches `LLM(accel=True)` makes on CUDA for the default model (SmolLM2-135M: 9 query heads, 3 KV
    heads of 64; layers 576 wide, MLP 1536), in `dtype`: decode attention (a plain step and a CUDA-graph step,
    which also attends to its own new token; both once more for one sequence of 32,768 tokens, which the wrapper
    splits 44 ways, and the kernel that combines the splits), and the INT8 and INT4 linears for a decode step
    (one row: split K) and a prompt chunk (512 rows), INT4 in groups of 32 (`LLM`'s default) and 128
    (`quantize_model`'s); in float16 also the row kernel a T4 runs for decode steps (compute capability 7.5: no
    tensor-core tl.dot)."""
    from ..engine.llm_engine import EngineConfig
    from ..planner.presets import PRESETS, load_config
    from ..quant import int4
    from . import triton_quant
    from . import triton_paged

    cfg = load_config(PRESETS["SmolLM2-135M-Instruct"])
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    block_size, seqs, blocks = EngineConfig().block_size, 4, 8
    q = torch.zeros(seqs, heads, head_dim, dtype=dtype)  # [num_seqs, heads, head_dim]
    cache = torch.zeros(seqs * blocks, block_size, kv_heads, head_dim, dtype=dtype)  # [blocks, block_size, kv, d]
    tables = torch.arange(seqs * blocks, dtype=torch.int32).view(seqs, blocks)  # [num_seqs, max_blocks]
    lens = torch.full((seqs,), 40, dtype=torch.int32)  # [num_seqs]
    new = torch.zeros(seqs, kv_heads, head_dim, dtype=dtype)  # [num_seqs, kv_heads, head_dim]
    attend = triton_paged.triton_paged_decode_attention
    long_table = torch.zeros(1, 32768 // block_size, dtype=torch.int32)  # one sequence of 32k tokens; ids unread
    one = (q[:1], cache, cache, long_table, lens[:1])
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    codes, scales = torch.zeros(inter, hidden, dtype=torch.int8), torch.ones(inter)
    packed = {g: int4.quantize_int4(torch.zeros(inter, hidden), g) for g in (32, 128)}  # (packed, scales, mins)

    def x(rows: int) -> torch.Tensor:
        return torch.zeros(rows, hidden, dtype=dtype)  # [rows, hidden]

    calls = {
        "decode attention": (triton_paged, "_paged_decode_kernel", lambda: attend(q, cache, cache, tables, lens)),
        "decode attention, graph step": (triton_paged, "_paged_decode_kernel",
                                         lambda: attend(q, cache, cache, tables, lens, new, new)),
        "decode attention, 32k split": (triton_paged, "_paged_decode_kernel", lambda: attend(*one)),
        "decode attention, 32k split, graph step": (triton_paged, "_paged_decode_kernel",
                                                    lambda: attend(*one, new[:1], new[:1])),
        "decode attention, combine splits": (triton_paged, "_combine_splits_kernel", lambda: attend(*one)),
        "int8 linear, 1 row": (triton_quant, "_int8_linear_kernel",
                               lambda: triton_quant.int8_linear(x(1), codes, scales)),
        "int8 linear, 512 rows": (triton_quant, "_int8_linear_kernel",
                                  lambda: triton_quant.int8_linear(x(512), codes, scales)),
    }
    for g, (p, s, m) in packed.items():
        for rows in (1, 512) if g == 32 else (1,):  # a prompt's tiles are the same for both group sizes
            calls[f"int4 linear g{g}, {rows} row{'s' * (rows > 1)}"] = (
                triton_quant, "_int4_linear_kernel",
                lambda rows=rows, p=p, s=s, m=m: triton_quant.int4_linear(x(rows), p, s, m, hidden))
    if dtype == torch.float16:  # the row kernel runs below compute capability 8.0, where there is no bfloat16
        t4 = (7, 5)
        calls["int8 row kernel, 1 row"] = (triton_quant, "_rows_linear_kernel",
                                           lambda: triton_quant.int8_linear(x(1), codes, scales, capability=t4))
        for g, rows in ((32, 1), (128, 4)):
            p, s, m = packed[g]
            calls[f"int4 g{g} row kernel, {rows} row{'s' * (rows > 1)}"] = (
                triton_quant, "_rows_linear_kernel",
                lambda rows=rows, p=p, s=s, m=m: triton_quant.int4_linear(x(rows), p, s, m, hidden, capability=t4))
    return {name: record_launch(module, kernel, call) for name, (module, kernel, call) in calls.items()}


def table() -> list[dict]:
    """One row per (launch, card, dtype): bfloat16 only where the card has it (compute capability >= 8.0)."""
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        launches = engine_launches(dtype)
        for card in CARDS:
            if dtype == torch.bfloat16 and not card.has_bfloat16:
                continue
            for name, launch in launches.items():
                c = compile_launch(launch, card.capability)
                rows.append(dict(kernel=name, card=card.name, sm=card.capability, dtype=str(dtype)[6:],
                                 dot=c.has_dot, mma=c.tensor_core_op,
                                 registers=c.registers, spills=c.spill_bytes, shared=c.shared_bytes,
                                 shared_limit=card.max_shared_per_block, warps=c.num_warps))
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    head = "| kernel | card (sm) | dtype | compiled | tensor-core op | registers | spill bytes | shared memory |"
    lines = [head, "|" + " --- |" * 8]
    for r in rows:
        mma = (r["mma"] or "none (FMA)") if r["dot"] else "-"
        shared = f"{r['shared'] / 1024:.1f} of {r['shared_limit'] // 1024} KiB"
        lines.append(f"| {r['kernel']} | {r['card']} ({r['sm']}) | {r['dtype']} | yes | {mma} | "
                     f"{r['registers']} | {r['spills']} | {shared} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(table()))
