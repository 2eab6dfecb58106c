"""What the first cell of every chapter does: one device and dtype for the whole chapter, quiet libraries.

    setup = setup_chapter()   # Machine: AMD EPYC 7B13 · 2 cores · 8 GiB · torch 2.5.1 · cpu float32
    llm = LLM(setup.model, device=setup.device, dtype=setup.dtype)
    ax.set_title(f"TTFT against prompt length, {setup.label}")
"""
from __future__ import annotations

import logging
import os
import socket
import warnings
from dataclasses import dataclass

import torch

from .dtypes import resolve_device_dtype
from .host import cpu_model, echo

# The model chapters 05, 07, 08 and 09 load on a GPU when the Hub is reachable. The default 135M model is too small
# for a GPU: a decode step is ~1,300 kernel launches against well under a millisecond of weight reading, so it is
# launch-bound, not bandwidth-bound, and those chapters' lessons (the roofline, batching, INT4) would not show.
# SmolLM2-1.7B-Instruct is the default model's big sibling: the same architecture and the same tokenizer.
GPU_MODEL = "HuggingFaceTB/SmolLM2-1.7B-Instruct"

@dataclass
class ChapterSetup:
    """The device, dtype and threads a chapter uses end to end, and a label for plot titles."""

    device: torch.device
    dtype: torch.dtype
    threads: int
    name: str  # the processor or GPU
    model: str | None = None  # what the chapter's LLM(...) loads: None = the default, SmolLM2-135M-Instruct

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
    """The GPU's name, or the CPU's model name (`course_lib.host.cpu_model`: /proc/cpuinfo on Linux)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


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


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers (a TCP connection), unless HF_HUB_OFFLINE says not to try."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def chapter_model(device: torch.device, gpu_model: str | None = None) -> str | None:
    """The model a chapter loads: COURSE_MODEL if set ("default" = the shipped model), else `gpu_model` on CUDA
    when the Hub is reachable, else None (the default model, offline)."""
    chosen = os.environ.get("COURSE_MODEL", "").strip()
    if chosen:
        return None if chosen == "default" else chosen
    if gpu_model is not None and device.type == "cuda" and hub_reachable():
        return gpu_model
    return None


def setup_chapter(device: torch.device | str | None = None, dtype: torch.dtype | str | None = None,
                  seed: int = 0, verbose: bool = True, gpu_model: str | None = None) -> ChapterSetup:
    """Pick the chapter's device ("cuda" when present, else the CPU), the engine's dtype for it and the model,
    seed torch, quiet the libraries, and print the machine and the choice in one line (`ChapterSetup.machine`).

    The environment variables COURSE_DEVICE and COURSE_DTYPE override the defaults (not explicit arguments):
    a test runs a chapter in bfloat16 on the CPU, as a stand-in for a GPU's dtype, with COURSE_DTYPE=bfloat16.
    `gpu_model` (say `GPU_MODEL`): the model to use on CUDA with a network; COURSE_MODEL overrides it anywhere
    (a Hub id, a local directory or .gguf file, or "default"). A chapter on another model prints which.
    """
    quiet_libraries()
    device = device if device is not None else os.environ.get("COURSE_DEVICE") or None
    dtype = dtype if dtype is not None else os.environ.get("COURSE_DTYPE") or None
    dev, dt = resolve_device_dtype(device, dtype)
    setup = ChapterSetup(dev, dt, torch.get_num_threads(), processor_name(dev), chapter_model(dev, gpu_model))
    torch.manual_seed(seed)
    if verbose:
        echo(setup.machine)  # not print(): a console that cannot encode `·` must not stop the chapter
        if setup.model is not None:
            echo(f"Model: {setup.model} (COURSE_MODEL=default keeps the course's SmolLM2-135M-Instruct)")
    return setup
