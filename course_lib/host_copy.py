"""Host -> device in one copy: a step's small integer tensors packed into one staging buffer.

Each `torch.tensor(list, device="cuda")` is a copy of its own, and one from pageable memory waits until the
GPU has finished the work already queued. Packing a step's inputs into one pinned buffer and copying it
with `non_blocking=True` makes one transfer that queues behind the GPU's work instead of waiting for it.
On the CPU the copy is a no-op; the packing and splitting are the same code.

`copy_into` and `staged` do the same for one tensor a step builds from Python lists (a CUDA graph's block
tables, the rows the sampler picks, a logit bias): built in pinned memory, copied without waiting. Pinned
memory only where `pins` says so (the device is CUDA and CUDA is there: `pin_memory` needs it); elsewhere they
are `torch.tensor` and `copy_`, as before. Freeing a pinned tensor whose copy is still queued is safe: PyTorch's
caching host allocator reuses its memory only once the copy has finished.
"""
from __future__ import annotations

import torch


def pins(device: torch.device | str) -> bool:
    """Whether host->device copies to `device` go through pinned memory: only to CUDA, with CUDA available."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def staged(data: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`data` (a list, or lists of equal length) as a `dtype` tensor on `device`, built in pinned memory where
    `pins(device)` and copied with non_blocking=True; on the CPU plainly `torch.tensor(data, dtype=dtype)`."""
    host = torch.tensor(data, dtype=dtype, pin_memory=pins(device))
    return host if host.device == torch.device(device) else host.to(device, non_blocking=True)


def copy_into(target: torch.Tensor, data: list) -> torch.Tensor:
    """Write `data` (its shape) into the contiguous device tensor `target` (a CUDA graph's static input) in one
    host->device copy from pinned memory where `pins(target.device)`. Returns `target`."""
    if not target.is_contiguous():
        raise ValueError("copy_into writes contiguous targets: one copy, no strided scatter")
    host = torch.tensor(data, dtype=target.dtype, pin_memory=pins(target.device))
    return target.copy_(host.view(target.shape), non_blocking=True)


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
    if pins(device):
        staging = staging.pin_memory()
    staging = staging.to(device, non_blocking=True)  # the one copy
    out, start = [], 0
    for t in tensors:
        out.append(staging[start:start + t.numel()].view(t.shape).to(t.dtype))
        start += t.numel()
    return out
