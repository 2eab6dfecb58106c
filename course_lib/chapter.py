"""What the first cell of every chapter does: one device and dtype for the whole chapter, quiet libraries.

    setup = setup_chapter()   # Machine: AMD EPYC 7B13 · 2 cores · 8 GiB · torch 2.5.1 · cpu float32
    llm = LLM(device=setup.device, dtype=setup.dtype)
    ax.set_title(f"TTFT against prompt length, {setup.label}")
"""
from __future__ import annotations

import logging
import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .dtypes import resolve_device_dtype


@dataclass
class ChapterSetup:
    """The device, dtype and threads a chapter uses end to end, and a label for plot titles."""

    device: torch.device
    dtype: torch.dtype
    threads: int
    name: str  # the processor or GPU

    @property
    def label(self) -> str:
        """E.g. "cpu (AMD EPYC 7B13, 2 threads), float32" or "cuda (Tesla T4), float16"."""
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.device.type == "cpu" else ""
        return f"{self.device.type} ({self.name}{threads}), {str(self.dtype).removeprefix('torch.')}"

    @property
    def machine(self) -> str:
        """The one line at the top of every chapter that says where its numbers came from:
        "Machine: <CPU model> · <N> cores · <RAM> GiB · torch <version> · <device> <dtype>"."""
        import psutil

        cpu = processor_name(torch.device("cpu"))
        device = f"cuda ({self.name})" if self.device.type == "cuda" else self.device.type
        ram = psutil.virtual_memory().total / 2**30
        return (f"Machine: {cpu} · {os.cpu_count()} cores · {ram:.0f} GiB · torch {torch.__version__} · "
                f"{device} {str(self.dtype).removeprefix('torch.')}")


def processor_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def quiet_libraries() -> None:
    """No progress bars or library warnings in a saved notebook (tqdm, transformers, huggingface_hub)."""
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("transformers", "huggingface_hub", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|torch|accelerate)\b")
    warnings.filterwarnings("ignore", category=FutureWarning)


def setup_chapter(device: torch.device | str | None = None, dtype: torch.dtype | str | None = None,
                  seed: int = 0, verbose: bool = True) -> ChapterSetup:
    """Pick the chapter's device ("cuda" when present, else the CPU) and the engine's dtype for it,
    seed torch, quiet the libraries, and print the machine and the choice in one line (`ChapterSetup.machine`).

    The environment variables COURSE_DEVICE and COURSE_DTYPE override the defaults (not explicit arguments):
    a test runs a chapter in bfloat16 on the CPU, as a stand-in for a GPU's dtype, with COURSE_DTYPE=bfloat16.
    """
    quiet_libraries()
    device = device if device is not None else os.environ.get("COURSE_DEVICE") or None
    dtype = dtype if dtype is not None else os.environ.get("COURSE_DTYPE") or None
    dev, dt = resolve_device_dtype(device, dtype)
    setup = ChapterSetup(dev, dt, torch.get_num_threads(), processor_name(dev))
    torch.manual_seed(seed)
    if verbose:
        print(setup.machine)
    return setup
