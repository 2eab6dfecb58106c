"""C++ kernel: decode attention over the paged KV cache on the CPU (`paged_decode_cpu.cpp`).

The PyTorch reference, `paged.paged_decode_attention`, gathers every sequence's blocks into one
padded tensor and runs a masked SDPA: it writes the whole context of the batch once more and then
reads it back, padding included. This kernel reads each sequence's K/V once, in place, through its
block table. The fast path (`PagedAttention(use_cpp=True)`) also sends a prompt's tokens through it, each
a row that sees the tokens up to itself: one call a layer for the whole step. Its figures per call are at
the top of the source (`python -m benchmarks.decode_attention` measures them on your machine, against the
reference); `benchmarks/compare.py` measures whole steps.

The source is compiled on first use (`course_lib.cpp_build`: needs a C++ compiler and ninja; ~30-60 s
once, then cached by PyTorch). Where it cannot be built, `available()` is False, says why once, and
the engine keeps the PyTorch reference.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..cpp_build import load_cpu_extension, register_fake

SOURCE = Path(__file__).with_name("paged_decode_cpu.cpp")


@functools.cache
def _extension():
    """The built kernel, or None. Loading it also defines the operator `course_lib::paged_decode_attention`
    (the arguments of `cpu_paged_decode_attention`) that compiled decode steps call, in C++: no Python per call."""
    kernel = load_cpu_extension("paged_decode_cpu", SOURCE)
    if kernel is not None:  # the output is contiguous, as the kernel's is, whatever q's strides
        register_fake("paged_decode_attention", lambda q, *args, **kwargs: q.new_empty(q.shape))
    return kernel


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
    not in the cache yet, after its context_lens cached ones (then context_lens may be 0). Any strides and
    integer types: the kernel makes them contiguous int32 itself."""
    return _extension().paged_decode_attention(q, k_cache_layer, v_cache_layer, block_tables, context_lens,
                                               k_new, v_new)
