"""`BackgroundServer`: uvicorn in a thread of this process, for tests and notebooks that share the model.

    with BackgroundServer(create_app(llm)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")

`python -m course_lib.serve` is the same app in a process of its own (what a deployment runs).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI

from ..host import free_port


def wait_until_healthy(base_url: str, process: subprocess.Popen | None = None, timeout: float = 120,
                       path: str = "/health") -> float:
    """Poll `base_url` + `path` until it answers 200; returns the seconds it took. (A server with no /health,
    such as llama-cpp-python's, is ready when `path="/v1/models"` answers.)

    Raises if `timeout` passes or `process` (a server started with `python -m course_lib.serve`) exits first,
    with what it printed."""
    t0 = time.perf_counter()
    while True:
        try:
            if httpx.get(base_url + path, timeout=1).status_code == 200:
                return time.perf_counter() - t0
        except httpx.TransportError:
            pass
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}:\n"
                               + (process.stdout.read() if process.stdout else ""))
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"the server at {base_url} did not answer {path} within {timeout:.0f} s")
        time.sleep(0.2)


# Windows can send another process no SIGINT: a server started in a process group of its own (these options to
# subprocess.Popen) is stopped with Ctrl-Break instead. Elsewhere there is nothing to add.
SERVER_PROCESS_OPTIONS: dict = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if os.name == "nt" else {}


def stop_gracefully(process: subprocess.Popen) -> None:
    """Ask a `python -m course_lib.serve` process to finish its open requests and exit, as Ctrl-C in its terminal
    would: SIGINT on Linux and macOS, Ctrl-Break on Windows (start it with `**SERVER_PROCESS_OPTIONS` there)."""
    process.send_signal(signal.CTRL_BREAK_EVENT if os.name == "nt" else signal.SIGINT)


class BackgroundServer:
    """Serve `app` on `host:port` (a free port by default) from a daemon thread until `stop()`."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int | None = None, graceful_seconds: int = 10):
        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=graceful_seconds))
        self.thread = threading.Thread(target=self.server.run, name="course_lib-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop accepting, let open requests finish (`graceful_seconds` at most), shut the engine down."""
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
