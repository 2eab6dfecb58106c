"""The same client benchmark against several OpenAI-compatible servers (chapter 11), its table and its figure.

    rows = sweep(base_url, "course_lib", users=(1, 4, 16), max_tokens=32)   # one row per number of users
    saved = load_saved()                     # benchmarks/serve_peers.json: {"machine": ..., "rows": [...]}
    comparison_table(rows + saved["rows"])   # TTFT, ITL, TPOT and tokens/s, engines side by side
    plot_engines(rows, title=...)            # tokens/s and TTFT against users, one line per engine

    exe = llama_cpp_binary("llama-server")   # llama.cpp's own server (`make bench-peers` builds it), or None
    rows += sweep_llama_server(exe, "llama-server", parallel=16)   # started on the course's GGUF file, swept, stopped

`benchmarks/serve_peers.py` starts the servers and saves a full run; a chapter runs `sweep` live on its own server.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure

from ..host import cpu_features
from ..loading import default_gguf_path
from ..serve.background import SERVER_PROCESS_OPTIONS, free_port, stop_gracefully, wait_until_healthy
from ..serve.bench import benchmark, summarize

SAVED = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_peers.json"
USERS = (1, 4, 16)
LLAMA_CPP_BUILD = Path(__file__).resolve().parents[2] / "build" / "llama.cpp"  # `make bench-peers` builds here
LLAMA_CPP_BIN = "LLAMA_CPP_BIN"  # environment variable: a folder with llama.cpp's binaries (a release, your build)


def llama_cpp_binary(name: str) -> Path | None:
    """llama.cpp's program `name` ("llama-server", "llama-bench"): in the folder $LLAMA_CPP_BIN names, else in
    `make bench-peers`'s build, else on PATH; None when none has it."""
    exe = name + ".exe" if os.name == "nt" else name
    folders = [Path(os.environ[LLAMA_CPP_BIN])] if os.environ.get(LLAMA_CPP_BIN) else []
    folders += [LLAMA_CPP_BUILD / "cmake" / "bin", LLAMA_CPP_BUILD / "cmake" / "bin" / "Release"]  # Release: MSVC
    for path in (folder / exe for folder in folders):
        if path.is_file():
            return path
    found = shutil.which(name)
    return Path(found) if found else None


def llama_server_command(exe: Path | str, port: int, parallel: int, threads: int | None = None,
                         model: Path | str | None = None, ctx_size: int = 8192) -> list[str]:
    """The command line of llama.cpp's `llama-server` on `model` (default: the course's GGUF file).

    `parallel` slots decode together, new requests joining between steps (continuous batching), and share
    `ctx_size` tokens of KV cache; `threads` (default: torch's, as the course's server gets) decode and prefill.
    `--port` is always passed, since llama-server's default port is changing. Only warnings and errors are
    logged, so a pipe that nobody reads never fills. On CPUs with AMX, weight repacking is off: llama.cpp's AMX
    repack of Q4_1 crashed on multi-token batches (llama.cpp issue #20824), and a server's prompts are such batches.
    """
    threads = threads or torch.get_num_threads()
    command = [str(exe), "--model", str(model or default_gguf_path()), "--host", "127.0.0.1", "--port", str(port),
               "--parallel", str(parallel), "--ctx-size", str(ctx_size), "--threads", str(threads),
               "--threads-batch", str(threads), "--no-webui", "--log-verbosity", "2"]
    return command + (["--no-repack"] if "amx_int8" in cpu_features().split() else [])


def sweep(base_url: str, engine: str, users: Sequence[int] = USERS, requests_per_user: int = 1,
          max_tokens: int = 32, prompt_words: int = 40) -> list[dict]:
    """`course_lib.serve.bench` at each number of concurrent users; one dict per run (seconds, tokens/s).

    Each run sends `requests_per_user` x users greedy streaming requests, at most `users` at a time, and lets the
    model stop on its own (no `ignore_eos`: not every server knows it). A server that sends no `usage` in its
    stream (llama-cpp-python's) gets its output tokens counted as its content chunks, one token each there.
    """
    benchmark(base_url, concurrency=2, num_requests=2, max_tokens=4, ignore_eos=False)  # warm-up, not measured
    rows = []
    for n in users:
        summary, records = benchmark(base_url, concurrency=n, num_requests=n * requests_per_user,
                                     max_tokens=max_tokens, prompt_words=prompt_words, ignore_eos=False)
        if any(r.output_tokens == 0 and r.chunk_times for r in records):
            for r in records:
                r.output_tokens = r.output_tokens or len(r.chunk_times)
            summary = summarize(records, summary["duration"])
        errors = sorted({r.error for r in records if r.error})  # why requests failed, kept with the run
        rows.append({"engine": engine, "users": n, **summary, **({"errors": errors} if errors else {})})
    return rows


def sweep_llama_server(exe: Path | str, engine: str, parallel: int, threads: int | None = None,
                       **sweep_args) -> list[dict]:
    """Start `llama-server` (`llama_server_command`: the course's GGUF file, `parallel` slots) on a free port,
    `sweep` it (`sweep_args`), stop it; its rows, named `engine`."""
    port = free_port()
    server = subprocess.Popen(llama_server_command(exe, port, parallel, threads), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, **SERVER_PROCESS_OPTIONS)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", server, timeout=600)
        return sweep(f"http://127.0.0.1:{port}", engine, **sweep_args)
    finally:
        stop_gracefully(server)
        server.wait(timeout=60)


def load_saved(path: Path | str = SAVED) -> dict | None:
    """The last full run `benchmarks/serve_peers.py` saved ({"machine", "settings", "rows"}), or None."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def comparison_table(rows: Sequence[dict]) -> pd.DataFrame:
    """Users down, engines across: TTFT p50, ITL p50, TPOT p50 (ms) and output tokens/s (all users together)."""
    frame = pd.DataFrame(rows)
    table = pd.DataFrame({"engine": frame.engine, "users": frame.users,
                          "TTFT p50 (ms)": (frame.ttft_p50 * 1e3).round(1),
                          "ITL p50 (ms)": (frame.itl_p50 * 1e3).round(1),
                          "TPOT p50 (ms)": (frame.tpot_p50 * 1e3).round(1),
                          "tokens/s": frame.output_throughput.round(1),
                          "failed": frame.failed})
    return table.pivot(index="users", columns="engine").swaplevel(axis=1).sort_index(axis=1, level=0,
                                                                                       sort_remaining=False)


def plot_engines(rows: Sequence[dict], title: str) -> Figure:
    """Left: output tokens/s (all users) against users; right: TTFT p50; one line per engine."""
    frame = pd.DataFrame(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for engine, part in frame.groupby("engine", sort=False):
        left.plot(part.users, part.output_throughput, marker="o", label=engine)
        right.plot(part.users, part.ttft_p50 * 1e3, marker="o", label=engine)
    for ax, label in ((left, "output tokens/s, all users"), (right, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(frame.users.unique()), [str(u) for u in sorted(frame.users.unique())])
        ax.set_xlabel("concurrent users")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
