"""When two float results count as the same: a tolerance scaled to the values compared and to their dtype.

Two correct computations of the same numbers differ by rounding, and by how much depends on the kernels: another
CPU or GPU adds the same terms in another order. Rounding is relative (a float32 keeps about 7 significant digits
at any size), so a difference is judged against the size of the values, max |got - want| / max |want|, next to
the dtype's spacing eps, never as a bare absolute number that passed on one host.
"""
from __future__ import annotations

import torch

# torch.testing.assert_close's default rtol per dtype: a few roundings of one operation.
OP_RTOL = {torch.float64: 1e-7, torch.float32: 1.3e-6, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
# A whole forward pass (30 layers of matmuls, norms and softmaxes) computed by two programs: roundings compound.
MODEL_RTOL = {torch.float32: 3e-5, torch.float16: 2e-2, torch.bfloat16: 4e-2}


def eps(dtype: torch.dtype) -> float:
    """The gap between 1.0 and the next float of `dtype` (float32: 1.19e-7, bfloat16: 7.8e-3)."""
    return torch.finfo(dtype).eps


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, computed in float64 (the bare max |got - want| where `want` is all zeros;
    0 for empty tensors)."""
    got, want = torch.as_tensor(got).detach().cpu().double(), torch.as_tensor(want).detach().cpu().double()
    if want.numel() == 0 and got.numel() == 0:
        return 0.0
    diff, scale = (got - want).abs().max().item(), want.abs().max().item()
    return diff / scale if scale > 0 else diff


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str = "results") -> float:
    """Raise AssertionError unless `relative_difference(got, want) <= rtol`; return that relative difference."""
    if torch.as_tensor(got).shape != torch.as_tensor(want).shape:
        raise AssertionError(f"{what}: shapes differ, {tuple(got.shape)} against {tuple(want.shape)}")
    rel = relative_difference(got, want)
    if not rel <= rtol:  # also catches NaN
        raise AssertionError(f"{what}: max |difference| / max |value| = {rel:.2e}, over the tolerance {rtol:.1e}")
    return rel


__all__ = ["MODEL_RTOL", "OP_RTOL", "assert_close", "eps", "relative_difference"]
