"""Builds the engine's C++ kernels for the CPU, once per machine, with `torch.utils.cpp_extension.load`.

Each source is compiled on first use with -O3 -march=native and OpenMP (~20-60 s once, then cached
by PyTorch). That needs a C++ compiler and ninja; where a build fails, `load_cpu_extension` warns
once and returns None, and the engine keeps its PyTorch path. COURSE_LIB_NO_CPP=1 turns all of them off.

PyTorch guards a build directory with a plain `lock` file: a process killed while holding it (a kernel
interrupted during its first load) leaves it behind, and every later load waits on it forever. So loads
here also take an OS lock, which dies with its process; whoever holds that lock knows a `lock` file it
finds is stale, and removes it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path


def cpuinfo(field: str) -> str | None:
    """The first `field` line's value in /proc/cpuinfo (Linux), or None."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(field))
    except (OSError, StopIteration):
        return None
    return line.partition(":")[2].strip()


def cpu_tag() -> str:
    """A short hash of this CPU's feature flags: a build made with -march=native for one CPU is never
    loaded on another (PyTorch's build cache is keyed by the source and flags, not by the CPU)."""
    flags = cpuinfo("flags") or platform.processor() or platform.machine()
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


@functools.cache
def cpu_vendor() -> str:
    """'GenuineIntel', 'AuthenticAMD', ...: MKL chooses its code by it (`packed_linear.float32_kernel`)."""
    return cpuinfo("vendor_id") or platform.processor() or ""


def toolchain_available() -> bool:
    """A C++ compiler and ninja are on PATH: where they are, the kernels are expected to build (the tests insist)."""
    return shutil.which("c++") is not None and shutil.which("ninja") is not None


@functools.cache
def load_cpu_extension(name: str, source: Path):
    """The compiled module of `source`, or None (with one warning) when this machine cannot build it."""
    if os.environ.get("COURSE_LIB_NO_CPP") == "1":
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        full_name = f"course_lib_{name}_{cpu_tag()}"
        build_dir = Path(_get_build_directory(full_name, verbose=False))
        with build_lock(build_dir):
            return load(name=full_name, sources=[str(source)], build_directory=str(build_dir),
                        extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"], extra_ldflags=["-fopenmp"],
                        verbose=False)
    except Exception as e:  # no compiler, no ninja, a failed build: keep the PyTorch path
        warnings.warn(f"the C++ kernel {source.name} could not be built ({type(e).__name__}: {e}); "
                      "the engine uses its PyTorch path instead (slower)")
        return None


def register_fake(name: str, fake) -> None:
    """Give the operator `course_lib::<name>`, which a kernel's source defines in C++ (TORCH_LIBRARY), the
    function that computes its output's shape and dtype without running it: `torch.compile` traces with it.
    Call it once, right after the source is loaded (its loader is cached)."""
    import torch

    torch.library.register_fake(f"course_lib::{name}")(fake)


@contextlib.contextmanager
def build_lock(build_dir: Path):
    """Hold an OS file lock on `build_dir` (released when this process ends, however it ends) and, holding
    it, remove PyTorch's `lock` file: no other course_lib process can be building there, so it is stale."""
    try:
        import fcntl
    except ImportError:  # not POSIX: PyTorch's own lock file only
        yield
        return
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "course_lib.flock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a second process waits here while the first builds
        (build_dir / "lock").unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
