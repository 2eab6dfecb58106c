"""`python -m course_lib.serve`: the OpenAI-compatible server in a process of its own.

    python -m course_lib.serve                                  # the default model on 127.0.0.1:8000
    python -m course_lib.serve --dtype bfloat16 --port 8001 --max-num-seqs 32
    python -m course_lib.serve --reference                      # the pure-PyTorch engine (default: accel=True)
    python -m course_lib.serve --tensor-parallel-size 3         # every layer split over 3 processes (reference engine)
    COURSE_API_KEY=secret python -m course_lib.serve --host 0.0.0.0   # other machines, with a key
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{"prompt": "Hi", "max_tokens": 8}'

Ctrl-C (SIGINT) or SIGTERM: stop accepting, let open requests finish (up to --graceful-seconds),
abort the rest, exit.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from ..chapter import quiet_libraries
from ..engine.llm import LLM
from .app import create_app
from .background import BackgroundServer
from .guards import LOOPBACK_HOSTS, ServeConfig


def kv_memory(text: str) -> int | float:
    """Bytes ("536870912", "512MiB") or a fraction of free GPU memory ("0.5")."""
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return float(text) if "." in text else int(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a .gguf file, a model directory or a Hub id (default: SmolLM2)")
    ap.add_argument("--served-model-name", default=None, help="the name clients pass as `model`")
    ap.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other machines (set --api-key too)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: by device)")
    ap.add_argument("--quantization", default=None, choices=["int8", "int4"])
    ap.add_argument("--kv-cache-memory", type=kv_memory, default=None,
                    help="KV cache size: bytes, 512MiB, or a fraction of free GPU memory such as 0.5")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="most requests in one batch")
    ap.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's)")
    ap.add_argument("--default-max-tokens", type=int, default=16, help="max_tokens when a request gives none")
    ap.add_argument("--compile-decode", action="store_true", help="torch.compile the decode step (minutes)")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps (vLLM's flag)")
    ap.add_argument("--speculative-config", type=json.loads, default=None,
                    help='JSON, as vLLM takes it: \'{"method": "ngram", "num_speculative_tokens": 4}\'')
    ap.add_argument("--reference", action="store_true",
                    help="run the pure-PyTorch reference engine (default: LLM(accel=True), this machine's kernels)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="split every layer over this many processes (implies --reference; kv cache size is per rank)")
    ap.add_argument("--graceful-seconds", type=int, default=30, help="on shutdown, how long open requests get")
    ap.add_argument("--api-key", default=os.environ.get("COURSE_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on all but /health (default: $COURSE_API_KEY)")
    ap.add_argument("--allowed-hosts", default=None,
                    help="comma-separated Host names to answer, or '*' (default: loopback names and --host)")
    ap.add_argument("--max-body-bytes", type=int, default=ServeConfig.max_body_bytes, help="larger bodies get a 413")
    ap.add_argument("--limit-concurrency", type=int, default=None, help="most open /v1 requests; more get a 503")
    ap.add_argument("--request-timeout", type=float, default=None, help="seconds before a request is aborted (408)")
    args = ap.parse_args(argv)
    hosts = tuple(h.strip().lower() for h in args.allowed_hosts.split(",")) if args.allowed_hosts \
        else ServeConfig.hosts_for(args.host)
    config = ServeConfig(api_key=args.api_key or None, allowed_hosts=hosts, max_body_bytes=args.max_body_bytes,
                         limit_concurrency=args.limit_concurrency, request_timeout=args.request_timeout)
    quiet_libraries()
    engine_args = {k: v for k, v in dict(kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
                                         max_model_len=args.max_model_len).items() if v is not None}
    reference = args.reference or args.tensor_parallel_size > 1  # tensor parallelism runs the reference engine
    llm = LLM(args.model, device=args.device, dtype=args.dtype, quantization=args.quantization,
              accel=not reference, compile_decode=args.compile_decode, enforce_eager=args.enforce_eager,
              speculative_config=args.speculative_config, tensor_parallel_size=args.tensor_parallel_size,
              **engine_args)
    name = args.served_model_name or (Path(args.model).stem if args.model else "SmolLM2-135M-Instruct")
    # uvicorn in a thread, the engine loop in this one: the thread that loaded the model steps it (see AsyncEngine).
    app = create_app(llm, name, args.default_max_tokens, engine_thread=False, config=config)
    server = BackgroundServer(app, args.host, args.port, graceful_seconds=args.graceful_seconds).start()

    def stop(signum, frame) -> None:  # uvicorn drains open requests, then the app's shutdown stops the loop
        server.server.should_exit = True

    for name in ("SIGINT", "SIGTERM", "SIGBREAK"):  # SIGBREAK: Ctrl-Break, Windows' way to stop another process
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), stop)
    print(f"serving {name} on http://{args.host}:{args.port}/v1 ({llm.device}, {llm.model.dtype})", flush=True)
    if config.api_key is None and args.host not in (*LOOPBACK_HOSTS, "::1"):
        print(f"warning: {args.host} accepts other machines and no API key is set: anyone who can reach this port "
              "can use the model (set --api-key or COURSE_API_KEY)", flush=True)
    watchdog = threading.Thread(target=lambda: (server.thread.join(), app.state.engine.shutdown()), daemon=True)
    watchdog.start()  # however uvicorn ends, the loop below ends with it
    app.state.engine.run()  # returns once the server has shut down
    server.thread.join(timeout=args.graceful_seconds + 10)
    llm.close()  # stops tensor-parallel workers, if any


if __name__ == "__main__":
    main()
