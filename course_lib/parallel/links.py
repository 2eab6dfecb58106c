"""What an all-reduce costs on a link: datasheet bandwidths, the ring formula, and a measurement on this machine.

A ring all-reduce of B bytes over tp ranks runs 2 (tp - 1) steps; in each, every rank sends B / tp bytes to its
neighbour and receives as much. So each rank's link carries 2 (tp - 1) / tp x B bytes each way, and

    t = 2 (tp - 1) x per_step_latency + 2 (tp - 1) / tp x B / (bandwidth each way)

NCCL picks other algorithms (trees, NVLink SHARP) where they are faster; the ring is the textbook bound.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..host import free_port


@dataclass(frozen=True)
class Link:
    """A connection between two devices: bytes per second each way, and where the figure comes from."""

    name: str
    bytes_per_s: float  # each way, per device
    source: str
    latency_s: float | None = None  # one small all-reduce over 4 devices (nccl-tests), seconds; None: not known
    latency_source: str = ""


_NVLINK_LAT = ("nccl-tests all_reduce_perf, small messages: ~17 us over 4 NVLink GPUs with the ring (DGX-A100, "
               "NVIDIA/nccl-tests#123), ~6 us on 2 H100s with NVLink SHARP (NVIDIA/nccl#1259); taken as 10 us")
_PCIE_LAT = ("nccl-tests all_reduce_perf, 8-byte messages: ~26 us on 2 GPUs behind a PCIe switch (ROCm/rccl#362), "
             "~40 us on 8 RTX 4090s over PCIe (NVIDIA/nccl#1530); taken as 30 us")
_H100 = "NVIDIA H100 datasheet: https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
LINKS: dict[str, Link] = {link.name: link for link in [
    Link("PCIe 4.0 x16", 32e9, "PCI-SIG: 16 GT/s a lane x 16 lanes, 128b/130b coding, about 32 GB/s each way",
         30e-6, _PCIE_LAT),
    Link("PCIe 5.0 x16", 64e9, f"{_H100} (PCIe Gen5: 128 GB/s, both ways together)", 30e-6, _PCIE_LAT),
    Link("NVLink 4 (H100 SXM)", 450e9, f"{_H100} (NVLink: 900 GB/s, both ways together)", 10e-6, _NVLINK_LAT),
    Link("InfiniBand NDR (between machines)", 50e9, "NVIDIA ConnectX-7: 400 Gb/s a port = 50 GB/s each way"),
]}


def ring_all_reduce_seconds(nbytes: float, tp: int, link: Link, per_step_latency_s: float = 0.0) -> float:
    """The ring formula above: seconds for one all-reduce of `nbytes` over `tp` ranks on `link`."""
    if tp < 2:
        return 0.0
    steps = 2 * (tp - 1)
    return steps * per_step_latency_s + steps / tp * nbytes / link.bytes_per_s


def all_reduce_seconds(nbytes: float, tp: int, link: Link, calls: int = 1, latency_s: float | None = None) -> float:
    """`calls` all-reduces of `nbytes` each over `tp` ranks: calls x (per-call latency + the ring's bandwidth term).

    `latency_s` (default: `link.latency_s`) is the fixed cost of one call, as nccl-tests measures it with tiny
    messages; a decode step makes 2 x layers + 1 calls, so it adds up even when the bytes are few."""
    if tp < 2:
        return 0.0
    latency = link.latency_s if latency_s is None else latency_s
    if latency is None:
        raise ValueError(f"{link.name} has no per-call latency figure: pass latency_s")
    return calls * (latency + ring_all_reduce_seconds(nbytes, tp, link))


def _time_all_reduce(rank: int, world: int, addr: str, sizes: list[int], repeats: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=addr, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    times = {}
    for n in sizes:
        x = torch.ones(n // 4, dtype=torch.float32)
        for _ in range(3):  # warm-up: the sockets' buffers grow to the size
            dist.all_reduce(x)
        samples = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            samples.append(time.perf_counter() - t0)
        times[n] = statistics.median(samples)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def measure_all_reduce(sizes: list[int], world_size: int = 2, repeats: int = 20) -> dict[int, float]:
    """Median seconds of one gloo all-reduce of each size in bytes, between `world_size` processes here."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_time_all_reduce, args=(r, world_size, addr, list(sizes), repeats, out), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        times = out.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return times
