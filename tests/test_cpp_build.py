"""The C++ kernels: their build cache survives a process killed mid-load (a learner's Ctrl-C during the first build),
and every source ships with the package."""
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.cpp_extension import _get_build_directory

from course_lib.cpp_build import cpu_tag, toolchain_available

LOAD = "from course_lib.attention import cpu_paged; assert cpu_paged.available(), 'did not build'"


@pytest.mark.skipif(not toolchain_available(), reason="needs a C++ compiler and ninja")
def test_a_stale_build_lock_is_cleared_not_waited_on():
    subprocess.run([sys.executable, "-c", LOAD], check=True, timeout=600)  # built (or found built) once
    build_dir = Path(_get_build_directory(f"course_lib_paged_decode_cpu_{cpu_tag()}", verbose=False))
    (build_dir / "lock").touch()  # what a process killed while holding PyTorch's lock leaves behind
    # PyTorch alone waits on that file forever: the timeout turns a hang into a failure
    subprocess.run([sys.executable, "-c", LOAD], check=True, timeout=120)
    assert not (build_dir / "lock").exists()


def test_every_kernel_source_ships_with_the_package():
    """A .cpp that pyproject's package-data leaves out builds from a checkout but not from an installed wheel."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["course_lib"]
    sources = sorted(p.relative_to(root / "course_lib").as_posix() for p in (root / "course_lib").rglob("*.cpp"))
    assert sources and all(any(fnmatch.fnmatch(s, pat) and s.count("/") == pat.count("/") for pat in patterns)
                           for s in sources), sources
