"""llama.cpp's own `llama-server` and `llama-bench`, built from llama.cpp's sources: the course's peers.

    python -m benchmarks.peers build                 # make bench-peers: sources, cmake, two binaries
    python -m benchmarks.peers build --sdist llama_cpp_python-0.3.36.tar.gz   # sources already downloaded
    python -m benchmarks.peers where                 # where each binary is found, or that it is not

The sources are the llama.cpp that `llama-cpp-python`'s sdist vendors (`vendor/llama.cpp/`), fetched with pip,
the one registry the course already uses; a pinned version keeps the peer the same from run to run. The build is
cmake's Release build for this machine's CPU (`GGML_NATIVE`), static, with no HTTPS, no downloads, no web UI, no
tests and no examples: only the targets `llama-server` (continuous batching, `--parallel N`) and `llama-bench`.
It needs cmake and a C++ compiler and takes 10-25 minutes on 2 cores. Everything lands in `build/llama.cpp/`
(git-ignored). `binary(name)` finds a binary in the folder `$LLAMA_CPP_BIN` names, else in that build, else on
PATH, so a llama.cpp built or installed elsewhere (a release zip, Homebrew) serves as well. `build` needs the
standard library only, so that Windows, which has no make, runs the same: `py -m benchmarks.peers build`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "llama.cpp"  # where course_lib.viz.engines.llama_cpp_binary looks (a test checks)
SDIST = "llama-cpp-python"
VERSION = "0.3.36"  # its vendored llama.cpp; RESULTS.md's llama.cpp rows name the version they ran
TARGETS = ("llama-server", "llama-bench")
ENV_VAR = "LLAMA_CPP_BIN"  # course_lib.viz.engines.LLAMA_CPP_BIN
CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "ON",  # this machine's instruction sets (AVX-512, VNNI, ...), as a local build would
    "BUILD_SHARED_LIBS": "OFF",  # binaries that run wherever they are copied
    "LLAMA_CURL": "OFF",  # older sources: no libcurl
    "LLAMA_OPENSSL": "OFF",  # newer sources: no HTTPS (models come from a local file)
    "LLAMA_USE_PREBUILT_UI": "OFF",  # no download of the web UI at build time
    "LLAMA_BUILD_UI": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
}


def binary(name: str) -> Path | None:
    """Path of llama.cpp's `name` ("llama-server", "llama-bench"): $LLAMA_CPP_BIN, this build, PATH; else None.
    The finder is course_lib's (`course_lib.viz.engines.llama_cpp_binary`), which chapter 11 uses too."""
    from course_lib.viz.engines import llama_cpp_binary  # here, so that `build` needs the standard library only

    return llama_cpp_binary(name)


def missing(names: tuple[str, ...] = TARGETS) -> str | None:
    """None when every binary is found, else one line that says which is not and how to get it."""
    absent = [n for n in names if binary(n) is None]
    if not absent:
        return None
    return f"{', '.join(absent)} not found: make bench-peers (python -m benchmarks.peers build) or set ${ENV_VAR}"


def sdist(dest: Path, version: str) -> Path:
    """The sdist of llama-cpp-python `version` in `dest`, downloaded with pip unless it is there already."""
    found = sorted(dest.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(dest),
                    f"{SDIST}=={version}"], check=True)
    return dest / f"llama_cpp_python-{version}.tar.gz"


def extract(archive: Path, dest: Path) -> Path:
    """Unpack only the sdist's vendor/llama.cpp/ into `dest`; returns the source folder."""
    with tarfile.open(archive) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        prefix = f"{top}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not any(m.name == prefix + "CMakeLists.txt" for m in members):
            raise SystemExit(f"{archive} has no {prefix}CMakeLists.txt: not an sdist that vendors llama.cpp")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4 / 3.12
        tar.extractall(dest, members=members, **kwargs)
    return dest / prefix


def vendored_commit(archive: Path) -> str | None:
    """The llama.cpp commit the sdist vendors (its git submodule's HEAD, kept in the sdist), or None. The sources
    carry no git history, so without it `llama-server --version` would say "commit unknown"."""
    with tarfile.open(archive) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        try:
            head = tar.extractfile(f"{top}/.git/modules/vendor/llama.cpp/HEAD")
        except KeyError:
            return None
        text = head.read().decode().strip() if head else ""
    return text[:7] if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else None


def build(archive: Path | None = None, version: str = VERSION, jobs: int | None = None) -> dict[str, Path]:
    """Build llama-server and llama-bench into build/llama.cpp/cmake/bin; returns their paths."""
    if shutil.which("cmake") is None:
        raise SystemExit("cmake not found: install cmake and a C++ compiler (apt install cmake g++; on Windows "
                         "Visual Studio's C++ tools), then run this again")
    BUILD.mkdir(parents=True, exist_ok=True)
    archive = archive or sdist(BUILD, version)
    stem = archive.name.removesuffix(".tar.gz")
    src = BUILD / stem / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        print(f"unpacking llama.cpp from {archive}", flush=True)
        src = extract(archive, BUILD)
    out = BUILD / "cmake"
    cache = out / "CMakeCache.txt"
    if cache.is_file() and f"CMAKE_HOME_DIRECTORY:INTERNAL={src.resolve().as_posix()}" not in cache.read_text():
        shutil.rmtree(out)  # configured for other sources (another version): cmake refuses to reuse it
    env = dict(os.environ)  # compile jobs: --jobs, else $CMAKE_BUILD_PARALLEL_LEVEL, else every core
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs or env.get("CMAKE_BUILD_PARALLEL_LEVEL") or os.cpu_count() or 1)
    options = CMAKE_OPTIONS | ({"LLAMA_BUILD_COMMIT": commit} if (commit := vendored_commit(archive)) else {})
    configure = ["cmake", "-S", str(src), "-B", str(out)] + [f"-D{k}={v}" for k, v in options.items()]
    subprocess.run(configure, check=True, env=env)
    subprocess.run(["cmake", "--build", str(out), "--config", "Release", "--target", *TARGETS], check=True, env=env)
    folder = out / "bin" / "Release" if (out / "bin" / "Release").is_dir() else out / "bin"  # Release/: MSVC
    paths = {name: folder / (name + ".exe" if os.name == "nt" else name) for name in TARGETS}
    for name, path in paths.items():
        print(f"{name}: {path}")
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download llama.cpp's sources and build llama-server and llama-bench")
    b.add_argument("--sdist", type=Path, help="a llama-cpp-python sdist (.tar.gz) already on disk")
    b.add_argument("--version", default=VERSION, help=f"llama-cpp-python version to fetch (default {VERSION})")
    b.add_argument("--jobs", type=int, help="parallel compile jobs (default: every core)")
    sub.add_parser("where", help="print where each binary is found")
    args = ap.parse_args(argv)
    if args.command == "build":
        build(args.sdist, args.version, args.jobs)
    else:
        for name in TARGETS:
            print(f"{name}: {binary(name) or 'not found'}")
        if problem := missing():
            sys.exit(problem)


if __name__ == "__main__":
    main()
