"""C++ kernel: decode attention over the paged KV cache on the CPU (`paged_decode_cpu.cpp`).

The PyTorch reference, `paged.paged_decode_attention`, gathers every sequence's blocks into one
padded tensor and runs a masked SDPA: it writes the whole context of the batch once more and then
reads it back, padding included. This kernel reads each sequence's K/V once, in place, through its
block table. Measured with torch 2.13 on a 2-core Xeon, bfloat16, the default model's heads, per
layer: see `benchmarks/compare.py` and the note of issue 12 for the step-level effect.

The source is compiled on first use with `torch.utils.cpp_extension.load` (needs a C++ compiler and
ninja; ~30-60 s once, then cached by PyTorch). Where it cannot be built, `available()` is False,
says why once, and the engine keeps the PyTorch reference.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("paged_decode_cpu.cpp")


def _cpu_tag() -> str:
    """A short hash of this CPU's feature flags: a build made with -march=native for one CPU is never
    loaded on another (PyTorch's build cache is keyed by the source and flags, not by the CPU)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor() or platform.machine()
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


@functools.cache
def _extension():
    """The compiled module, or None (with one warning) when this machine cannot build it."""
    if os.environ.get("COURSE_LIB_NO_CPP") == "1":
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(name=f"course_lib_paged_decode_cpu_{_cpu_tag()}", sources=[str(SOURCE)],
                    extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"], extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no ninja, a failed build: keep the PyTorch path
        warnings.warn(f"the C++ paged decode kernel could not be built ({type(e).__name__}: {e}); "
                      "decode attention on the CPU uses the PyTorch reference (slower)")
        return None


def toolchain_available() -> bool:
    """A C++ compiler and ninja are on PATH: where they are, the kernel is expected to build (the tests insist)."""
    import shutil

    return shutil.which("c++") is not None and shutil.which("ninja") is not None


def available(device: torch.device | str = "cpu") -> bool:
    """True when `device` is the CPU and the kernel is built (building it now if needed).

    COURSE_LIB_NO_CPP=1 turns it off."""
    return torch.device(device).type == "cpu" and _extension() is not None


def cpu_paged_decode_attention(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `paged_decode_attention`: q [num_seqs, heads, head_dim]; k/v_cache_layer [num_blocks,
    block_size, kv_heads, head_dim]; block_tables [num_seqs, max_blocks]; context_lens [num_seqs], each >= 1.
    Returns [num_seqs, heads, head_dim].

    With k_new, v_new [num_seqs, kv_heads, head_dim], each sequence also attends to one more token that is
    not in the cache yet, after its context_lens cached ones (then context_lens may be 0)."""
    contiguous = lambda t: None if t is None else t.contiguous()  # noqa: E731
    return _extension().paged_decode_attention(
        q.contiguous(), k_cache_layer.contiguous(), v_cache_layer.contiguous(),
        block_tables.to(torch.int32).contiguous(), context_lens.to(torch.int32).contiguous(),
        contiguous(k_new), contiguous(v_new))


@torch.library.custom_op("course_lib::paged_decode_attention", mutates_args=())
def paged_decode_op(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor,
                    k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None) -> torch.Tensor:
    """`cpu_paged_decode_attention` as a PyTorch operator, so a `torch.compile`d graph can call it."""
    return cpu_paged_decode_attention(q, k_cache_layer, v_cache_layer, block_tables, context_lens, k_new, v_new)


@paged_decode_op.register_fake
def _(q, k_cache_layer, v_cache_layer, block_tables, context_lens, k_new=None, v_new=None):
    return torch.empty_like(q)
