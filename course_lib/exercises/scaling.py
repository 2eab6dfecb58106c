"""Checkers for chapter 13 (scaling out): one rank's share of an MLP, all-reduce bytes, devices needed.

    check_mlp_shard(mlp_shard)              # (x, w_gate, w_up, w_down, rank, tp) -> rank's partial output
    check_all_reduce_bytes(all_reduce_bytes)  # (config, tp, bytes_per_value) -> bytes per token into all-reduces
    check_devices_needed(devices_needed)    # (weight_gb, kv_gb, activation_gb, usable_gb, num_heads) -> tp or None
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..parallel.accounting import comm_per_token
from ..tolerance import OP_RTOL, relative_difference
from .check import Case, run_checks


def reference_mlp_shard(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                        rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s partial output of a SwiGLU MLP: its rows of gate/up, its columns of down. Summed over the
    ranks, the partials give the whole MLP's output (the all-reduce does that sum)."""
    n = w_up.shape[0] // tp
    rows = slice(rank * n, (rank + 1) * n)
    return (F.silu(x @ w_gate[rows].T) * (x @ w_up[rows].T)) @ w_down[:, rows].T


def check_mlp_shard(fn: Callable) -> bool:
    """`fn(x, w_gate, w_up, w_down, rank, tp)`: rank's partial output; the sum over ranks must be the MLP's output."""
    gen = torch.Generator().manual_seed(0)
    h, inter = 16, 48
    x = torch.randn(3, h, generator=gen, dtype=torch.float64)
    w_gate, w_up = (torch.randn(inter, h, generator=gen, dtype=torch.float64) for _ in range(2))
    w_down = torch.randn(h, inter, generator=gen, dtype=torch.float64)
    whole = (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T

    def partial_of(rank: int, tp: int) -> Callable:
        def verify(got) -> None:
            want = reference_mlp_shard(x, w_gate, w_up, w_down, rank, tp)
            assert tuple(got.shape) == tuple(want.shape), f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            assert relative_difference(got, want) <= OP_RTOL[torch.float64], \
                "not rank's partial sum: use rows rank*n:(rank+1)*n of gate and up, the same columns of down"
        return verify

    def sums_to_whole(tp: int) -> Callable:
        def verify(parts) -> None:
            total = sum(p.double() for p in parts)
            rel = relative_difference(total, whole)
            assert rel <= OP_RTOL[torch.float64], f"the partials add up to the MLP's output only within {rel:.1e}"
        return verify

    cases = [Case("rank 0 of 2", (x, w_gate, w_up, w_down, 0, 2), partial_of(0, 2)),
             Case("rank 1 of 2", (x, w_gate, w_up, w_down, 1, 2), partial_of(1, 2)),
             Case("rank 2 of 4", (x, w_gate, w_up, w_down, 2, 4), partial_of(2, 4)),
             Case("tp = 1: the whole MLP", (x, w_gate, w_up, w_down, 0, 1), partial_of(0, 1))]
    passed = run_checks("mlp_shard", fn, cases)
    every_rank = Case("the 3 ranks' partials sum to the whole MLP (what the all-reduce computes)", (3,),
                      sums_to_whole(3))
    return passed and run_checks("mlp_shard (all ranks)",
                                 lambda tp: [fn(x, w_gate, w_up, w_down, r, tp) for r in range(tp)], [every_rank])


CONFIGS = {  # name -> config (only the sizes the formula reads matter)
    "SmolLM2-135M": ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                                num_heads=9, num_kv_heads=3),
    "Llama-3-70B": ModelConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                               num_heads=64, num_kv_heads=8),
}


def check_all_reduce_bytes(fn: Callable) -> bool:
    """`fn(config, tp, bytes_per_value)`: bytes each rank hands to all-reduces for one token of a forward."""
    dtypes = {2: torch.bfloat16, 4: torch.float32}

    def equals(expected: int) -> Callable:
        def verify(got) -> None:
            assert int(got) == expected, f"expected {expected:,} bytes, got {int(got):,}"
        return verify

    cases = [Case(f"{name}, tp = {tp}, {nbytes} bytes a value", (cfg, tp, nbytes),
                  equals(comm_per_token(cfg, tp, dtypes[nbytes]).all_reduce_bytes))
             for name, cfg in CONFIGS.items() for tp, nbytes in ((3, 4), (8, 2))]
    return run_checks("all_reduce_bytes", fn, cases)


def reference_devices_needed(weight_gb: float, kv_gb: float, activation_gb: float, usable_gb: float,
                             num_heads: int) -> int | None:
    """The smallest tp in 1, 2, 4, ... 64 that divides the heads and makes weights / tp + KV / tp + activations
    fit in `usable_gb`; None when none does."""
    for tp in (1, 2, 4, 8, 16, 32, 64):
        if num_heads % tp == 0 and weight_gb / tp + kv_gb / tp + activation_gb <= usable_gb:
            return tp
    return None


def check_devices_needed(fn: Callable) -> bool:
    """`fn(weight_gb, kv_gb, activation_gb, usable_gb, num_heads)`: the smallest tp that fits, or None."""
    def equals(expected) -> Callable:
        def verify(got) -> None:
            assert got == expected, f"expected {expected}, got {got}"
        return verify

    rows = [((16, 17, 0.5, 72, 32), "an 8B model fits one 80 GB card"),
            ((141, 43, 2, 72, 64), "a 70B model in bf16 on 80 GB cards"),
            ((141, 43, 2, 21.6, 64), "the same on 24 GB cards: sixteen"),
            ((30, 0, 0, 12, 12), "30 GB over 12 heads: 2 devices hold 15 GB each, too much; 4 fit"),
            ((60, 0, 0, 12, 12), "12 heads: 8 does not divide them, and 4 is too few: None"),
            ((10, 0, 8, 12, 8), "activations are not split: 5 + 8 GB on each of 2 is too much, 4 fit"),
            ((812, 68, 3, 2, 128), "405B on 2 GB devices: not within 64, None")]
    cases = [Case(what, args, equals(reference_devices_needed(*args))) for args, what in rows]
    return run_checks("devices_needed", fn, cases)
