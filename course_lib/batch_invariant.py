"""Batch invariance: the same prompt gives the same greedy tokens whatever else runs in its batch.

Floating-point addition is not associative, so a sum's result depends on the order of its terms. A matrix product
of M rows is computed by a kernel the library picks for M (and for how it splits the work among threads), so the
order in which one row's products are summed, and its last bits, change with the number of rows in the step.
Attention over a batch pads every sequence to the longest context, which changes the shapes again. In a
continuous-batching engine the rows of a step belong to whoever else is being served: one request's logits move
by a rounding error with the load, and where two tokens are nearly tied, greedy decoding flips.

The fix follows vLLM's batch-invariant mode (`VLLM_BATCH_INVARIANT=1`) and Thinking Machines' "Defeating
Nondeterminism in LLM Inference" (2025): reduce in an order that does not depend on the batch.
    linear layers: always multiply TILE_ROWS rows at a time (the last tile padded with zeros), so every product
        has the same shape, whatever the step holds; a row's result does not depend on its place in the tile
    attention: one sequence at a time, over exactly its own context (decode rows too)
    norms, RoPE, activations: per row already
The price is speed: small tiles use the matrix units less well than one big product (measured in chapter 12).
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import causal_attention
from .attention.paged import PagedAttention, gather_blocks, paged_decode_attention

TILE_ROWS = 8  # rows per matrix product; never 1, which some libraries route to a kernel of its own


class BatchInvariantLinear(nn.Module):
    """A linear layer (an `nn.Linear` or a `QuantLinear`) applied TILE_ROWS rows at a time."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    @property
    def weight(self) -> torch.Tensor:  # the tied embedding / lm_head table stays reachable
        return self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [n, in]
        n = rows.shape[0]
        padded = -(-n // TILE_ROWS) * TILE_ROWS
        if padded != n:
            rows = torch.cat([rows, rows.new_zeros(padded - n, rows.shape[1])])
        out = torch.cat([self.inner(rows[i:i + TILE_ROWS]) for i in range(0, padded, TILE_ROWS)])  # [padded, out]
        return out[:n].view(*x.shape[:-1], out.shape[-1])


def make_batch_invariant(model: nn.Module) -> int:
    """Wrap every linear layer of `model` (quantized ones too) in a `BatchInvariantLinear`, in place; returns how
    many. The embedding stays as it is: a lookup adds nothing up."""
    from .quant.linear import QuantLinear

    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, (nn.Linear, QuantLinear))]
    for parent, name, child in targets:
        setattr(parent, name, BatchInvariantLinear(child))
    return len(targets)


class BatchInvariantAttention(PagedAttention):
    """`PagedAttention` that attends one sequence at a time, decode rows included, so no sequence is padded to
    another's context: each query's sums run over its own keys in the same order at any batch size."""

    def attend_stored(self, q, k, v, k_cache, v_cache, out) -> None:
        md = self.attn_metadata
        for i, n in enumerate(self.query_lens):
            start, ctx = md.query_start_loc_cpu[i], md.context_lens_cpu[i]
            if n == 1:
                out[start] = paged_decode_attention(q[start:start + 1], k_cache, v_cache, md.block_tables[i:i + 1],
                                                    md.context_lens[i:i + 1], max_context_len=ctx)[0]
                continue
            blocks = md.block_tables[i:i + 1, :-(-ctx // self.kv_cache.block_size)].long()  # [1, blocks]
            keys = gather_blocks(k_cache, blocks)[:, :ctx]  # [1, ctx, kv_heads, head_dim], stored this step
            values = gather_blocks(v_cache, blocks)[:, :ctx]
            out[start:start + n] = causal_attention(q[None, start:start + n], keys, values, start=ctx - n)[0]
