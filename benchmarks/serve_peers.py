"""The same client benchmark against the course's server and llama.cpp's, serving the same GGUF file.

    python -m benchmarks.serve_peers                     # 1, 4 and 16 users -> benchmarks/serve_peers.json
    python -m benchmarks.serve_peers --users 1 4 --max-tokens 16 --json /tmp/quick.json

Both servers run one after the other, never at once, with the same number of threads: `python -m
course_lib.serve` (`LLM(accel=True)` on the default SmolLM2-135M-Instruct Q4_1 GGUF file, on CUDA when present)
with room for as many sequences as the most users, and llama.cpp's own C++ `llama-server` on that very file (on
the CPU) with as many slots (`--parallel N`), which it batches continuously as the course's server does. `make
bench-peers` builds llama-server from llama.cpp's sources (or set $LLAMA_CPP_BIN to a folder that holds one);
without it only the course's server runs, and the script says so. The JSON holds the `Machine:` line, the
settings, the host's load average and `core_speedup` (all threads against one on a matmul: below 1.5 another program
held a core, and llama.cpp's threads, which spin at every barrier, then wait many times longer than the work),
llama-server's version and command, and one row per engine and number of users (`course_lib.viz.engines.sweep`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from course_lib.chapter import setup_chapter
from course_lib.loading import default_gguf_path
from course_lib.planner.validate import busy_cores, core_speedup
from course_lib.serve import SERVER_PROCESS_OPTIONS, free_port, stop_gracefully, wait_until_healthy
from course_lib.viz.engines import (SAVED, USERS, comparison_table, llama_cpp_binary, llama_server_command,
                                    sweep, sweep_llama_server)

PEER = "llama.cpp (llama-server)"


def course_server(port: int, device: str, max_num_seqs: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_lib.serve", "--port", str(port), "--device", device,
                             "--max-num-seqs", str(max_num_seqs), "--kv-cache-memory", "256MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **SERVER_PROCESS_OPTIONS)


def run(name: str, server: subprocess.Popen, port: int, args) -> list[dict]:
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url, server, timeout=600)
        return sweep(base_url, name, users=args.users, requests_per_user=args.requests_per_user,
                     max_tokens=args.max_tokens, prompt_words=args.prompt_words)
    finally:
        stop_gracefully(server)
        server.wait(timeout=60)


def version(exe: Path) -> str:
    """What `llama-server --version` prints: its build number and commit."""
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((out.stdout + out.stderr).split())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, nargs="+", default=list(USERS), help="concurrent users, one run each")
    ap.add_argument("--requests-per-user", type=int, default=4, help="requests = users x this")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--json", default=str(SAVED))
    args = ap.parse_args(argv)
    setup = setup_chapter(verbose=False)
    threads, slots = torch.get_num_threads(), max(args.users)  # what the course's server gets by default
    print(setup.machine)
    load_start, speedup_start = list(os.getloadavg()), core_speedup()
    port = free_port()
    rows = run("course_lib", course_server(port, setup.device.type, slots), port, args)
    peer = {}
    if (exe := llama_cpp_binary("llama-server")) is not None:
        shown = (str(exe), str(default_gguf_path()))  # kept as file names: the folders are this machine's
        command = llama_server_command(exe, 8080, parallel=slots, threads=threads)  # the run takes a free port
        peer = {"version": version(exe), "command": " ".join(Path(c).name if c in shown else c for c in command)}
        print(f"{PEER}: {peer['version']}")
        rows += sweep_llama_server(exe, PEER, parallel=slots, threads=threads, users=args.users,
                                   requests_per_user=args.requests_per_user, max_tokens=args.max_tokens,
                                   prompt_words=args.prompt_words)
    else:
        print("llama-server not found: only the course's server ran (make bench-peers builds it, or set LLAMA_CPP_BIN)")
    speedups = [speedup_start, core_speedup()]
    result = {"machine": setup.machine, "settings": {k: v for k, v in vars(args).items() if k != "json"} |
              {"threads": threads}, "llama_server": peer,
              "load_average": {"start": load_start, "end": list(os.getloadavg())},  # other programs on the host
              "core_speedup": speedups, "busy": busy_cores(*speedups), "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(comparison_table(rows).to_string())
    if result["busy"]:
        print(f"not a fair run: {result['busy']}")
    return result


if __name__ == "__main__":
    main()
