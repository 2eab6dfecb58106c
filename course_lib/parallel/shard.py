"""`shard_model`: cut the ordinary `Transformer` down to one rank's share, in place (Megatron-style).

    attention:  q/k/v column-parallel by heads -> attend with the rank's heads -> o_proj row-parallel + all-reduce
    MLP:        gate/up column-parallel        -> silu(g) * u on its slice     -> down row-parallel + all-reduce
    embedding and lm_head: vocabulary-parallel (masked lookup + all-reduce; logits slice + all-gather)

The query heads and the MLP must split evenly (no padding): the default SmolLM2-135M (9 query heads, 3 KV heads,
MLP width 1536) runs with tp = 1 or 3 (3 query heads and 1 KV head per rank); tp = 2 is refused, naming the heads.
KV heads split when num_kv_heads % tp == 0 and are replicated when tp % num_kv_heads == 0 (fewer KV heads than
ranks: each rank keeps the one its query heads use). The vocabulary is padded to a multiple of tp.
`model.config` becomes the rank's config (its head counts and MLP width), so a `PagedKVCache` built from it holds
only this rank's KV heads; `model.tp` keeps the full config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..config import ModelConfig
from ..model import Transformer
from .layers import CommStats, RowParallelLinear, VocabParallelEmbedding, VocabParallelLMHead


@dataclass(frozen=True)
class TPShard:
    """Which share of the model one rank holds."""

    rank: int
    world_size: int
    full_config: ModelConfig
    q_heads: range  # this rank's query heads
    kv_heads: range  # this rank's key/value heads (the same ones on several ranks when replicated)
    vocab_start: int
    vocab_rows: int  # rows of the embedding/lm_head slice, padded so every rank holds the same number


def plan_shard(config: ModelConfig, rank: int, world_size: int) -> TPShard:
    """The heads, MLP columns and vocabulary rows of `rank`; a ValueError names any count that does not split."""
    tp, h, kv = world_size, config.num_heads, config.num_kv_heads
    if not 0 <= rank < tp:
        raise ValueError(f"rank must be in [0, {tp}), got {rank}")
    if h % tp:
        divisors = [d for d in range(1, h + 1) if h % d == 0]
        raise ValueError(f"tensor_parallel_size {tp} does not divide the model's {h} query heads "
                         f"({kv} KV heads): use one of {divisors}")
    if kv % tp and tp % kv:
        raise ValueError(f"tensor_parallel_size {tp} must divide the {kv} KV heads, or be a multiple of them "
                         f"(then each KV head is replicated on tp / {kv} ranks)")
    if config.intermediate_size % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide intermediate_size {config.intermediate_size}")
    hq = h // tp
    first_kv = rank * kv // tp if kv % tp == 0 else rank * hq // (h // kv)  # the KV head of the rank's query heads
    kv_local = max(kv // tp, 1)
    rows = -(-config.vocab_size // tp)
    return TPShard(rank, tp, config, range(rank * hq, (rank + 1) * hq), range(first_kv, first_kv + kv_local),
                   rank * rows, rows)


def rank_config(shard: TPShard) -> ModelConfig:
    """The rank's own config: its query/KV head counts and MLP width (hidden size and vocabulary stay whole)."""
    c = shard.full_config
    return dataclasses.replace(c, num_heads=len(shard.q_heads), num_kv_heads=len(shard.kv_heads),
                               intermediate_size=c.intermediate_size // shard.world_size, head_dim=c.head_dim)


def _rows(linear: nn.Linear, start: int, stop: int) -> nn.Linear:
    """A new `nn.Linear` holding output rows [start, stop) of `linear` (column-parallel)."""
    w = linear.weight
    out = nn.Linear(w.shape[1], stop - start, bias=linear.bias is not None, device=w.device, dtype=w.dtype)
    out.weight.data.copy_(w.data[start:stop])
    if linear.bias is not None:
        out.bias.data.copy_(linear.bias.data[start:stop])
    return out


def _cols(linear: nn.Linear, start: int, stop: int, stats: CommStats, group) -> RowParallelLinear:
    """Input columns [start, stop) of `linear`, its output summed over ranks (row-parallel; no bias here)."""
    if linear.bias is not None:
        raise ValueError("a row-parallel layer with a bias would add it once per rank")
    w = linear.weight
    out = nn.Linear(stop - start, w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    out.weight.data.copy_(w.data[:, start:stop])
    return RowParallelLinear(out, stats, group)


def _vocab_rows(weight: torch.Tensor, shard: TPShard) -> nn.Parameter:
    start, stop = shard.vocab_start, min(shard.vocab_start + shard.vocab_rows, weight.shape[0])
    out = torch.zeros(shard.vocab_rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
    out[:max(stop - start, 0)] = weight.data[start:stop]  # padding rows stay zero; the lm_head cuts them off
    return nn.Parameter(out, requires_grad=False)


@torch.no_grad()
def shard_model(model: Transformer, rank: int, world_size: int, group=None) -> Transformer:
    """Replace `model`'s layers by this rank's slices, in place, and return it. Call before `quantize_model`.

    The sharded forward issues its own collectives on `group` (default: the default process group), so every
    rank must run the same forward with the same inputs at the same time. `model.comm` counts them (`CommStats`).
    """
    if getattr(model, "tp", None) is not None:
        raise ValueError("this model is already sharded")
    config = model.config
    shard = plan_shard(config, rank, world_size)
    d, inter = config.head_dim, config.intermediate_size // world_size
    q0, q1 = shard.q_heads.start * d, shard.q_heads.stop * d
    k0, k1 = shard.kv_heads.start * d, shard.kv_heads.stop * d
    stats = CommStats()
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = _rows(attn.q_proj, q0, q1)
        attn.k_proj = _rows(attn.k_proj, k0, k1)
        attn.v_proj = _rows(attn.v_proj, k0, k1)
        attn.o_proj = _cols(attn.o_proj, q0, q1, stats, group)
        attn.num_heads, attn.num_kv_heads = len(shard.q_heads), len(shard.kv_heads)  # what Attention reshapes by
        mlp.gate_proj = _rows(mlp.gate_proj, rank * inter, (rank + 1) * inter)
        mlp.up_proj = _rows(mlp.up_proj, rank * inter, (rank + 1) * inter)
        mlp.down_proj = _cols(mlp.down_proj, rank * inter, (rank + 1) * inter, stats, group)
    embed = _vocab_rows(model.embed_tokens.weight, shard)
    head = embed if config.tie_word_embeddings else _vocab_rows(model.lm_head.weight, shard)
    model.embed_tokens = VocabParallelEmbedding(embed, shard.vocab_start, config.vocab_size, stats, group)
    model.lm_head = VocabParallelLMHead(head, config.vocab_size, stats, group)
    model.tp, model.comm = shard, stats
    model.config = rank_config(shard)
    return model
