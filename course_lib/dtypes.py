"""Dtype and device names: the API takes a torch dtype or its name everywhere."""
from __future__ import annotations

import torch

_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: torch.dtype | str | None, default: torch.dtype = torch.float32) -> torch.dtype:
    """`None` -> default; a name such as "bfloat16" or "torch.float16" -> the torch dtype."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(_NAMES))}")
    return _NAMES[key]


def dtype_name(dtype: torch.dtype | str) -> str:
    """"bfloat16" for torch.bfloat16, "bf16" or "torch.bfloat16"."""
    return str(resolve_dtype(dtype)).removeprefix("torch.")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The engine's dtype for a device: bfloat16 on a GPU that has it, float16 on one that does not, float32 on the CPU.

    "Has it" means native bfloat16 matmuls: compute capability 8.0 or later (Ampere: A100, A10, L4, RTX 30xx
    and newer) or an AMD GPU. A T4 (7.5) gets float16. `torch.cuda.is_bf16_supported()` is not the test:
    by default it also says yes where bfloat16 is only emulated, which on a T4 is several times slower.
    In float16 the model keeps its overflow-prone sums in float32: RMSNorm's mean of squares, the
    attention softmax (SDPA and the Triton kernel accumulate in float32) and the sampler's softmax.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    if torch.version.hip:
        return torch.bfloat16
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def default_device() -> str:
    """"cuda" when a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: torch.device | str | None) -> torch.device:
    """`None` -> the default device; a name such as "cuda:0" -> a torch.device that exists here."""
    try:
        resolved = torch.device(default_device() if device is None else device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} needs a CUDA GPU, and none is visible here; use device='cpu'")
    return resolved


def resolve_device_dtype(device: torch.device | str | None = None,
                         dtype: torch.dtype | str | None = None) -> tuple[torch.device, torch.dtype]:
    """The whole policy in one call, for every entry point: the device (CUDA when present, else the CPU)
    and the dtype asked for, or the device's default (`default_dtype`)."""
    resolved = resolve_device(device)
    return resolved, resolve_dtype(dtype, default_dtype(resolved))
