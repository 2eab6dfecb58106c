"""A throw-away JupyterLab server for the browser tests: free loopback port, random token, private settings.

The server serves `notebooks/` itself (so chapters import `course_lib` and read files exactly as a learner's
JupyterLab does), but nothing it writes lands in the repository: autosave is off, checkpoints, settings,
workspaces and runtime files live in a temporary folder.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# JupyterLab settings for a quiet, deterministic page: no autosave (running cells must not rewrite the
# chapters), every cell in the DOM (no windowing), no news or update toasts over the screenshots.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                      "checkForUpdates": False},
}


@dataclass
class LabServer:
    """A running JupyterLab: `url("lab/tree/x.ipynb")` gives an address with the token."""
    base: str
    token: str
    process: subprocess.Popen
    log_path: Path

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}/{path}{sep}token={self.token}"

    def api(self, method: str, path: str):
        """Call the server's REST API (`/api/...`) and return the decoded JSON (None for an empty reply)."""
        req = urllib.request.Request(f"{self.base}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Stop every session and kernel, so one test's kernels do not hold memory during the next."""
        for session in self.api("GET", "sessions"):
            self.api("DELETE", f"sessions/{session['id']}")
        for kernel in self.api("GET", "kernels"):
            self.api("DELETE", f"kernels/{kernel['id']}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_env(tmp: Path) -> dict[str, str]:
    """The environment of the server and of `jupyter trust`: Jupyter's data, settings, workspaces and runtime
    folders under `tmp`, so nothing is read from or written to the user's own."""
    env = dict(os.environ,
               JUPYTER_DATA_DIR=str(tmp / "data"),  # notebook signatures: what `trust_notebooks` records
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "lab-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"),  # ignore the user's jupyter_server_config
               PYTHONUNBUFFERED="1")
    env.pop("MPLBACKEND", None)  # the chapters draw inline figures, as in a learner's JupyterLab
    return env


def trust_notebooks(paths: list[Path], tmp: Path) -> None:
    """`jupyter trust` in the private data folder: records signatures there, leaves the notebooks untouched.
    A trusted notebook draws its saved widgets; an untrusted one shows their text fallback."""
    subprocess.run([sys.executable, "-m", "jupyter", "trust", *map(str, paths)], env=lab_env(tmp), check=True,
                   capture_output=True)


def start_lab(root_dir: Path, tmp: Path, timeout: float = 120.0) -> LabServer:
    """Start `jupyter lab` on a free loopback port and wait until its API answers."""
    env = lab_env(tmp)
    for name, value in LAB_SETTINGS.items():
        path = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--ServerApp.token={token}", f"--ServerApp.root_dir={root_dir}",
           f"--FileCheckpoints.root_dir={tmp / 'checkpoints'}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = tmp / "jupyter-lab.log"
    log = open(log_path, "wb")
    # A session of its own, so that stopping it also stops the kernels it started.
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root_dir,
                               start_new_session=True)
    log.close()
    server = LabServer(f"http://127.0.0.1:{port}", token, process, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            server.api("GET", "status")
            return server
        except OSError:
            if time.monotonic() > deadline:
                stop_lab(server)
                raise TimeoutError(f"jupyter lab did not answer in {timeout:.0f} s:\n{server.log_tail()}")
            time.sleep(0.5)


def stop_lab(server: LabServer, timeout: float = 20.0) -> None:
    """Stop the server and its kernels, whatever state they are in: kernels via the API, then SIGTERM to the
    server's process group, then SIGKILL to whatever of it (kernels included: they run in sessions of their
    own) is still alive."""
    try:
        children = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    try:
        if server.process.poll() is None:
            server.shutdown_kernels()
    except OSError:
        pass  # the server is already gone or wedged; the signals below still stop it
    try:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=timeout)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=timeout)
    _, alive = psutil.wait_procs(children, timeout=5)
    for proc in alive:
        proc.kill()
