"""The layers of a tensor-parallel Transformer: each holds one rank's slice and issues its own collective.

    column-parallel  (q/k/v, gate/up):  y_r = x @ W[rows of rank r]^T        no communication
    row-parallel     (o_proj, down):    y   = all_reduce_sum(x_r @ W[:, cols of rank r]^T)
    vocab-parallel embedding:            e   = all_reduce_sum(rank r's rows, zero for ids it does not hold)
    vocab-parallel lm_head:              logits = all_gather(x @ W[vocab slice of rank r]^T) along vocab

Column-parallel layers need no class: they are ordinary `nn.Linear`s holding fewer output rows.
Every collective goes through `all_reduce` / `all_gather_last` below, which count the bytes they move in the
`CommStats` that `shard_model` hands each layer (one per model: `model.comm`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class CommStats:
    """Collectives this process issued, and the bytes of the tensors they carried (the payload, per rank)."""

    all_reduces: int = 0
    all_reduce_bytes: int = 0
    all_gathers: int = 0
    all_gather_bytes: int = 0  # bytes of the gathered (full) tensor

    def reset(self) -> None:
        self.all_reduces = self.all_reduce_bytes = self.all_gathers = self.all_gather_bytes = 0


def all_reduce(x: torch.Tensor, stats: CommStats, group=None) -> torch.Tensor:
    """Sum `x` over the ranks of `group`, in place; counted in `stats`."""
    stats.all_reduces += 1
    stats.all_reduce_bytes += x.numel() * x.element_size()
    dist.all_reduce(x, group=group)
    return x


def all_gather_last(x: torch.Tensor, stats: CommStats, group=None) -> torch.Tensor:
    """Concatenate every rank's `x` along the last dimension; counted in `stats`."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    out = torch.cat(parts, dim=-1)
    stats.all_gathers += 1
    stats.all_gather_bytes += out.numel() * out.element_size()
    return out


class RowParallelLinear(nn.Module):
    """`linear` holds this rank's input columns; the partial outputs of all ranks are summed.

    The inner `nn.Linear` stays a plain linear layer, so `quantize_model` swaps it like any other.
    """

    def __init__(self, linear: nn.Module, stats: CommStats, group=None):
        super().__init__()
        self.linear, self.stats, self.group = linear, stats, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.linear(x), self.stats, self.group)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + rows) of the embedding table; ids held elsewhere look up zeros, then ranks sum."""

    def __init__(self, weight: nn.Parameter, start: int, vocab_size: int, stats: CommStats, group=None):
        super().__init__()
        self.stats = stats
        self.weight = weight  # [rows (padded), hidden]; the lm_head's too when the embeddings are tied
        self.start, self.vocab_size, self.group = start, vocab_size, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        held = (local >= 0) & (local < self.weight.shape[0]) & (ids < self.vocab_size)
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * held[..., None]
        return all_reduce(x, self.stats, self.group)


class VocabParallelLMHead(nn.Module):
    """This rank's slice of the vocabulary's logits, gathered from all ranks; padding rows are cut off.

    Holds a bare weight (not an `nn.Linear`), so `quantize_model` leaves it alone, as it leaves `lm_head`.
    """

    def __init__(self, weight: nn.Parameter, vocab_size: int, stats: CommStats, group=None):
        super().__init__()
        self.stats = stats
        self.weight, self.vocab_size, self.group = weight, vocab_size, group  # [rows (padded), hidden]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(F.linear(x, self.weight), self.stats, self.group)[..., :self.vocab_size]  # [..., vocab]
