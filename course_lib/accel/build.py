"""Builds the C++ kernels of `csrc/` into one extension, once per machine (`torch.utils.cpp_extension.load`).

The build needs a C++ compiler with OpenMP and ninja; it takes about a minute on a small CPU and PyTorch
caches it (in TORCH_EXTENSIONS_DIR). The kernels include ATen's headers, not `torch/extension.h` (the whole C++
frontend, several times slower to compile); only `module.cpp` needs pybind11. `build()` never raises: where
the build fails it warns once, naming what is missing, and returns None, and `accel` keeps the reference path
for what needed the kernels.
COURSE_LIB_NO_CPP=1 turns the kernels off.

PyTorch guards a build directory with a plain `lock` file: a process killed while holding it leaves it behind,
and every later build waits on it forever. So a build here also takes an OS lock, which dies with its process;
whoever holds that lock knows a `lock` file it finds is stale, and removes it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..host import cpu_features

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("module.cpp", "fused_ops.cpp", "linear.cpp", "attention.cpp")


@dataclass(frozen=True)
class BuildResult:
    """The loaded extension, or None and why not."""

    module: object | None
    problem: str | None = None


def cpu_tag() -> str:
    """A short hash of this CPU's feature flags: a build made with -march=native for one CPU is never loaded on
    another (PyTorch's build cache is keyed by the sources and flags, not by the CPU)."""
    return hashlib.sha1(cpu_features().encode()).hexdigest()[:10]


def missing_tools() -> list[str]:
    """What the build needs and this machine's PATH lacks."""
    compiler = os.environ.get("CXX", "c++")
    return [tool for tool in (compiler, "ninja") if shutil.which(tool) is None]


def extension_name() -> str:
    return f"course_lib_accel_{cpu_tag()}"


def build_directory() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(extension_name(), verbose=False))


def is_built() -> bool:
    """True when a build of the extension is in the cache already (loading it then takes a second)."""
    return any(build_directory().glob(f"{extension_name()}*.so"))


@functools.cache
def build() -> BuildResult:
    """The compiled extension, built now if the cache lacks it; BuildResult(None, why) where it cannot be built."""
    if os.environ.get("COURSE_LIB_NO_CPP") == "1":
        return BuildResult(None, "COURSE_LIB_NO_CPP=1")
    if missing := missing_tools():
        return _failed(f"no {' or '.join(missing)} on PATH")
    march = "-mcpu=native" if platform.machine() in ("arm64", "aarch64") else "-march=native"
    try:
        from torch.utils.cpp_extension import load

        build_dir = build_directory()
        if not is_built():
            print(f"course_lib.accel: building the C++ kernels in {build_dir} (once per machine, about a minute) ...",
                  file=sys.stderr, flush=True)
        with build_lock(build_dir):
            module = load(name=extension_name(), sources=[str(CSRC / s) for s in SOURCES],
                          build_directory=str(build_dir), extra_cflags=["-O3", march, "-fopenmp", "-ffast-math"],
                          extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # a compiler without OpenMP, a CPU the kernels do not support, ...
        return _failed(first_error(e))
    _register_fakes()
    return BuildResult(module)


def first_error(e: Exception) -> str:
    """The compiler's first error line in a failed build's message (the message ends with ninja's summary)."""
    lines = str(e).splitlines()
    errors = [line.strip() for line in lines if "error" in line.lower() and "ninja" not in line.lower()]
    return f"{type(e).__name__}: {(errors or [line for line in lines if line.strip()] or [''])[0][:300]}"


def _failed(why: str) -> BuildResult:
    warnings.warn(f"course_lib.accel: the C++ kernels could not be built ({why}); accel=True runs the reference "
                  "PyTorch code for attention, RMSNorm, RoPE and SiLU, and oneDNN alone for linear layers",
                  stacklevel=3)
    return BuildResult(None, why)


def _register_fakes() -> None:
    """Shapes and dtypes of the operators' outputs, which `torch.compile` traces with instead of running them."""
    fake = torch.library.register_fake
    fake("course_lib::onednn_linear")(lambda x, handle, out_features, panels=None, panel_rows=0:
                                      x.new_empty((x.shape[0], out_features)))
    fake("course_lib::int8_linear")(lambda x, codes, scales, many_rows: x.new_empty((x.shape[0], codes.shape[0])))
    fake("course_lib::w4a8_linear")(lambda x, packed, out_features, isa="": x.new_empty((x.shape[0], out_features)))
    fake("course_lib::paged_decode_attention")(lambda q, *args, **kwargs: q.new_empty(q.shape))


@contextlib.contextmanager
def build_lock(build_dir: Path):
    """Hold an OS file lock on `build_dir` (released when this process ends, however it ends) and, holding it,
    remove PyTorch's `lock` file: no other course_lib process can be building there, so it is stale."""
    try:
        import fcntl
    except ImportError:  # not POSIX: PyTorch's own lock file only
        yield
        return
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "course_lib.flock", "w", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # a second process waits here while the first builds
        (build_dir / "lock").unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
