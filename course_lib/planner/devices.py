"""Devices for the planner: datasheet figures of common cards, or this machine's ceilings, measured.

A device is three numbers and a source: memory (bytes), memory bandwidth (bytes/s) and dense
matmul FLOP/s per dtype. Datasheets quote tensor-core FLOP/s "with sparsity" (2:4 structured
sparsity, which inference with ordinary weights does not use): the table keeps the dense half.
GPU memory is built from power-of-two chips, so a datasheet's "80 GB" is 80 GiB here (1 GiB = 2**30 bytes):
nvidia-smi shows an H100 "80 GB" as 81,559 MiB (79.6 GiB) and an H200 "141 GB" as 143,771 MiB (140.4 GiB), close
to the GiB reading and 7% above the GB one (141 GB would be 131 GiB).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import default_dtype, dtype_name, resolve_device
from ..host import cpu_vendor
from ..profiling.memory import GiB
from .names import lookup

THIS_MACHINE = "this machine"  # the device name the CLI and the widget measure instead of looking up


@dataclass
class DeviceSpec:
    """What the planner needs to know about a device, and where the numbers came from."""

    name: str
    memory_bytes: int
    bandwidth: float  # bytes/s of memory traffic
    flops: dict[str, float]  # dense FLOP/s of a matmul, by dtype name ("bfloat16", "float16", "float32")
    source: str  # datasheet URL, or how it was measured
    kind: str = "gpu"  # "gpu" or "cpu": decides the INT4 layout (`QuantLinear`'s backend) the engine would use
    vendor: str | None = None  # a measured CPU's maker ("GenuineIntel", "AuthenticAMD"): picks `plan`'s fractions

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "bandwidth"):
            if not getattr(self, field) > 0:
                raise ValueError(f"DeviceSpec.{field} must be > 0, got {getattr(self, field)!r}")
        if not self.flops or any(not v > 0 for v in self.flops.values()):
            raise ValueError(f"DeviceSpec.flops must map dtype names to FLOP/s > 0, got {self.flops!r}")
        if self.kind not in ("gpu", "cpu"):
            raise ValueError(f"DeviceSpec.kind must be 'gpu' or 'cpu', got {self.kind!r}")

    @property
    def default_dtype(self) -> str:
        """The dtype an engine would pick here: bfloat16 where the device has it, else float16, else float32."""
        return next(d for d in ("bfloat16", "float16", "float32") if d in self.flops) \
            if self.kind == "gpu" else next(iter(self.flops))

    def peak_flops(self, dtype: torch.dtype | str) -> float:
        """Dense matmul FLOP/s in `dtype`; a ValueError names the dtypes this device has figures for."""
        name = dtype_name(dtype)
        if name not in self.flops:
            raise ValueError(f"{self.name} has no {name} FLOP/s figure (known: {', '.join(self.flops)}); "
                             f"pass dtype={self.default_dtype!r}")
        return self.flops[name]

    @classmethod
    def measure(cls, device: torch.device | str | None = None, dtypes: tuple[str, ...] | None = None,
                repeats: int = 5) -> "DeviceSpec":
        """This machine's ceilings, measured now with chapter 05's roofline (`course_lib.profiling.roofline`):
        bandwidth from a large copy, FLOP/s from a large matmul in each of `dtypes` (default: the engine's
        dtype for the device). Memory: the GPU's total, or the machine's RAM."""
        import psutil

        from ..chapter import processor_name
        from ..profiling.roofline import measure_bandwidth, measure_matmul_flops

        dev = resolve_device(device)
        dtypes = dtypes or (dtype_name(default_dtype(dev)),)
        flops = {dtype_name(d): measure_matmul_flops(dev, d, repeats=repeats) for d in dtypes}
        bandwidth = measure_bandwidth(dev, torch.float32, repeats=repeats)  # bytes move alike in any dtype
        if dev.type == "cuda":
            memory, kind = torch.cuda.get_device_properties(dev).total_memory, "gpu"
        else:
            memory, kind = psutil.virtual_memory().total, "cpu"
        threads = f", {torch.get_num_threads()} threads" if dev.type == "cpu" else ""
        return cls(f"{THIS_MACHINE} ({processor_name(dev)}{threads})", memory, bandwidth, flops,
                   "measured by DeviceSpec.measure(): a copy's bytes/s and a matmul's FLOP/s, best of "
                   f"{repeats} (course_lib.profiling.roofline)", kind, cpu_vendor() if kind == "cpu" else None)


def _gpu(name: str, memory_gib: float, bandwidth_gb_s: float, tflops: dict[str, float], source: str) -> DeviceSpec:
    return DeviceSpec(name, int(memory_gib * GiB), bandwidth_gb_s * 1e9, {k: v * 1e12 for k, v in tflops.items()},
                      source)


_NV = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center"
_AMPERE = {"bfloat16": 312, "float16": 312, "float32": 19.5}
_HOPPER = {"bfloat16": 989, "float16": 989, "float32": 67}
DEVICES: dict[str, DeviceSpec] = {d.name: d for d in [
    _gpu("T4", 16, 320, {"float16": 65, "float32": 8.1},  # Turing: no bfloat16
         f"NVIDIA T4 datasheet: {_NV}/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    _gpu("L4", 24, 300, {"bfloat16": 121, "float16": 121, "float32": 30.3},
         "NVIDIA L4 datasheet (242 TFLOPS bf16 with sparsity): "
         "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"),
    _gpu("A10", 24, 600, {"bfloat16": 125, "float16": 125, "float32": 31.2},
         f"NVIDIA A10 datasheet: {_NV}/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf"),
    _gpu("A100-40GB", 40, 1555, _AMPERE,
         f"NVIDIA A100 datasheet, SXM: {_NV}/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    _gpu("A100-80GB", 80, 2039, _AMPERE,
         f"NVIDIA A100 datasheet, SXM: {_NV}/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    _gpu("H100 SXM", 80, 3350, _HOPPER,
         "NVIDIA H100 datasheet (1,979 TFLOPS bf16 with sparsity): "
         "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    _gpu("H200", 141, 4800, _HOPPER, "NVIDIA H200 SXM specifications (141 GB; nvidia-smi: 143,771 MiB): "
         "https://www.nvidia.com/en-us/data-center/h200/"),
    _gpu("RTX 4090", 24, 1008, {"bfloat16": 165.2, "float16": 165.2, "float32": 82.6},
         "NVIDIA Ada Lovelace architecture whitepaper, appendix (tensor FP16/BF16 with FP32 accumulate, dense): "
         "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    _gpu("Apple M2 Max", 96, 400, {"bfloat16": 13.6, "float16": 13.6, "float32": 13.6},
         "Apple newsroom, Jan 2023 (400 GB/s, up to 96 GB unified memory): https://www.apple.com/newsroom/2023/01/"
         "apple-unveils-m2-pro-and-m2-max-next-generation-chips-for-next-level-workflows/; FLOP/s = 38 GPU cores "
         "x 128 ALUs x 2 x 1.398 GHz, 16-bit types at the fp32 rate"),
]}


def find_device(name: str | DeviceSpec) -> DeviceSpec:
    """A device from `DEVICES` by name, case-insensitive ("h100", "a100-80gb", "4090"); "this machine" measures."""
    if isinstance(name, DeviceSpec):
        return name
    found = lookup(name, [*DEVICES, THIS_MACHINE], "device")
    return DeviceSpec.measure() if found == THIS_MACHINE else DEVICES[found]
