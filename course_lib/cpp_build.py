"""Builds the engine's C++ kernels for the CPU, once per machine, with `torch.utils.cpp_extension.load`.

Each source is compiled on first use with -O3 -march=native and OpenMP (~20-60 s once, then cached
by PyTorch). That needs a C++ compiler and ninja; where a build fails, `load_cpu_extension` warns
once and returns None, and the engine keeps its PyTorch path. COURSE_LIB_NO_CPP=1 turns all of them off.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path


def cpu_tag() -> str:
    """A short hash of this CPU's feature flags: a build made with -march=native for one CPU is never
    loaded on another (PyTorch's build cache is keyed by the source and flags, not by the CPU)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor() or platform.machine()
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def toolchain_available() -> bool:
    """A C++ compiler and ninja are on PATH: where they are, the kernels are expected to build (the tests insist)."""
    return shutil.which("c++") is not None and shutil.which("ninja") is not None


@functools.cache
def load_cpu_extension(name: str, source: Path):
    """The compiled module of `source`, or None (with one warning) when this machine cannot build it."""
    if os.environ.get("COURSE_LIB_NO_CPP") == "1":
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(name=f"course_lib_{name}_{cpu_tag()}", sources=[str(source)],
                    extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"], extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as e:  # no compiler, no ninja, a failed build: keep the PyTorch path
        warnings.warn(f"the C++ kernel {source.name} could not be built ({type(e).__name__}: {e}); "
                      "the engine uses its PyTorch path instead (slower)")
        return None
