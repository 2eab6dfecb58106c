"""Host -> device in one copy: a step's small integer tensors packed into one staging buffer.

Each `torch.tensor(list, device="cuda")` is a copy of its own, and one from pageable memory waits until the
GPU has finished the work already queued. Packing a step's inputs into one pinned buffer and copying it
with `non_blocking=True` makes one transfer that queues behind the GPU's work instead of waiting for it.
On the CPU the copy is a no-op; the packing and splitting are the same code.
"""
from __future__ import annotations

import torch


def to_device_at_once(tensors: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """`tensors` (host; all integer, or all of one floating dtype) on `device`, copied in one transfer.

    They are flattened into one buffer (int64 for integers; pinned when the device is CUDA), copied once,
    and split back into views with their own shapes and dtypes.
    """
    device = torch.device(device)
    integer = all(not t.is_floating_point() for t in tensors)
    if not integer and len({t.dtype for t in tensors}) > 1:
        raise ValueError(f"pack integer tensors or floating tensors of one dtype, got {[t.dtype for t in tensors]}")
    common = torch.int64 if integer else tensors[0].dtype
    staging = torch.cat([t.reshape(-1).to(common) for t in tensors])  # [sum of numels], on the host
    if device.type == "cuda":
        staging = staging.pin_memory()
    staging = staging.to(device, non_blocking=True)  # the one copy
    out, start = [], 0
    for t in tensors:
        out.append(staging[start:start + t.numel()].view(t.shape).to(t.dtype))
        start += t.numel()
    return out
