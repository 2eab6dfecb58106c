"""What this computer is, read in one place, on Linux, macOS and Windows alike.

Linux describes its CPU in /proc/cpuinfo; macOS and Windows have no /proc, so every question here has an answer
from `platform` (or macOS's `sysctl`) as well. `echo` prints to a console whatever its encoding: a Windows
console or a pipe may be cp1252 or ASCII, and the course prints `·`, `✓` and Chinese.
"""
from __future__ import annotations

import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import TextIO

CPUINFO = Path("/proc/cpuinfo")  # Linux only; a test points it elsewhere to play another OS


def cpuinfo_field(name: str) -> str | None:
    """The first value of `name` ("model name", "vendor_id", "flags") in /proc/cpuinfo, or None without one."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13", "Apple M2"), or at least its architecture ("arm64")."""
    name = cpuinfo_field("model name")
    if name:
        return name
    if sys.platform == "darwin":
        try:
            brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            brand = ""
        if brand:
            return brand
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_vendor() -> str | None:
    """The CPU's maker as Linux reports it ("GenuineIntel", "AuthenticAMD"), or None where nothing says."""
    return cpuinfo_field("vendor_id")


def cpu_features() -> str:
    """This CPU's feature flags (x86's "flags", ARM's "Features"), or its name and architecture elsewhere:
    enough to tell two CPUs apart when a build is tuned to one of them."""
    return (cpuinfo_field("flags") or cpuinfo_field("Features")
            or f"{cpu_model()} {platform.machine()}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on right now (a server's, a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def echo(text: str, file: TextIO | None = None) -> None:
    """print(), except that characters the stream cannot encode become `?` instead of raising
    UnicodeEncodeError (a Windows pipe in cp1252, a console set to ASCII)."""
    stream = file if file is not None else sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.encode(encoding, errors="replace").decode(encoding)
    except LookupError:  # an encoding name Python does not know: leave the text as it is
        pass
    print(text, file=stream, flush=True)
