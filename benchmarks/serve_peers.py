"""The same client benchmark against the course's server and llama.cpp's, serving the same GGUF file.

    python -m benchmarks.serve_peers                     # 1, 4 and 16 users -> benchmarks/serve_peers.json
    python -m benchmarks.serve_peers --users 1 4 --max-tokens 16 --json /tmp/quick.json

Both servers run on this machine's CPU (or the course's on CUDA when present), one after the other, never at
once: `python -m course_lib.serve` (`LLM(accel=True)`, the default SmolLM2-135M-Instruct Q4_1 GGUF file) and
llama-cpp-python's `python -m llama_cpp.server` on that very file (needs `pip install "llama-cpp-python[server]"`;
without it only the course's server runs). llama-cpp-python's server runs one request at a time: it has no
continuous batching, unlike llama.cpp's own C++ `llama-server --parallel N`. The JSON holds the `Machine:` line,
the settings and one row per engine and number of users (`course_lib.viz.engines.sweep`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from course_lib.chapter import setup_chapter
from course_lib.loading import default_gguf_path
from course_lib.serve import free_port, wait_until_healthy
from course_lib.viz.engines import SAVED, USERS, comparison_table, llama_cpp_server_available, sweep


def course_server(port: int, device: str, max_num_seqs: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_lib.serve", "--port", str(port), "--device", device,
                             "--max-num-seqs", str(max_num_seqs), "--kv-cache-memory", "256MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def llama_cpp_server(port: int, threads: int) -> subprocess.Popen:
    here = Path(__file__).resolve().parent
    return subprocess.Popen([sys.executable, str(here / "llama_cpp_server.py"), "--model", str(default_gguf_path()),
                             "--port", str(port), "--n_ctx", "8192", "--n_threads", str(threads),
                             "--n_threads_batch", str(threads), "--interrupt_requests", "False",
                             "--verbose", "False"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(name: str, server: subprocess.Popen, port: int, args) -> list[dict]:
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url, server, path="/health" if name == "course_lib" else "/v1/models")
        return sweep(base_url, name, users=args.users, requests_per_user=args.requests_per_user,
                     max_tokens=args.max_tokens, prompt_words=args.prompt_words)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, nargs="+", default=list(USERS), help="concurrent users, one run each")
    ap.add_argument("--requests-per-user", type=int, default=4, help="requests = users x this")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--json", default=str(SAVED))
    args = ap.parse_args(argv)
    setup = setup_chapter(verbose=False)
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    print(setup.machine)
    load_start = list(os.getloadavg())
    port = free_port()
    rows = run("course_lib", course_server(port, setup.device.type, max(args.users)), port, args)
    if llama_cpp_server_available():
        port = free_port()
        rows += run("llama.cpp (llama-cpp-python)", llama_cpp_server(port, threads), port, args)
    else:
        print('llama.cpp skipped: pip install "llama-cpp-python[server]" (make bench-peers)')
    result = {"machine": setup.machine, "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "load_average": {"start": load_start, "end": list(os.getloadavg())},  # other programs on the host
              "rows": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(comparison_table(rows).to_string())
    return result


if __name__ == "__main__":
    main()
