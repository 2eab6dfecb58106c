"""Paged attention through a kernel: `PagedAttention` (`course_lib.attention.paged`) with its kernels swapped in.

    CppPagedAttention     CPU: every query row of a step in one call of `csrc/attention.cpp` a layer, decode
                          tokens and prompt tokens alike
    TritonPagedAttention  CUDA: the decode rows through `triton_paged.py`; prompt chunks as the reference does

The reference gathers every sequence's blocks into one padded tensor and runs a masked SDPA, writing the context
once more and reading it back. The kernels read each row's K/V once, in place, through its block table.

`decode_attention_with_new` is the PyTorch twin of the kernels' `k_new`/`v_new`: a decode step that stores its
K/V after its graph (compiled, or a CUDA graph) attends to its own new token beside the cached ones.
"""
from __future__ import annotations

import torch

from ..attention.paged import PagedAttention, PagedAttentionMetadata, PagedKVCache, attend_context, gather_context


def decode_attention_with_new(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                              block_tables: torch.Tensor, cached_lens: torch.Tensor, k_new: torch.Tensor,
                              v_new: torch.Tensor, max_context_len: int | None = None) -> torch.Tensor:
    """`paged_decode_attention` over each sequence's cached tokens plus one new token not yet in the cache:
    k_new, v_new [num_seqs, kv_heads, head_dim], after the cached ones and always visible (a cached_len may be 0).
    q [num_seqs, heads, head_dim] -> [num_seqs, heads, head_dim]."""
    k, v, visible = gather_context(k_cache_layer, v_cache_layer, block_tables, cached_lens, max_context_len)
    k, v = torch.cat([k, k_new[:, None]], 1), torch.cat([v, v_new[:, None]], 1)  # [num_seqs, ctx + 1, kv_heads, d]
    visible = torch.cat([visible, visible.new_ones(visible.shape[0], 1)], 1)  # [num_seqs, ctx + 1]
    return attend_context(q, k, v, visible)


class CppPagedAttention(PagedAttention):
    """Every query row of the step through the C++ kernel, one call a layer: token j of a chunk of n whose
    sequence reaches context_len is a row with its sequence's block table that sees the first
    context_len - n + j + 1 tokens, all in the cache once this step's K/V are stored. It sums in float32 for
    bfloat16 too. `ops`: the built extension."""

    def __init__(self, kv_cache: PagedKVCache, attn_metadata: PagedAttentionMetadata, ops):
        super().__init__(kv_cache, attn_metadata)
        self.ops, md, device = ops, attn_metadata, kv_cache.device
        row_seqs = [i for i, n in enumerate(self.query_lens) for _ in range(n)]
        sees = [md.context_lens_cpu[i] - n + j + 1 for i, n in enumerate(self.query_lens) for j in range(n)]
        self.row_tables = md.block_tables if self.all_decode else md.block_tables[
            torch.tensor(row_seqs, dtype=torch.int64, device=device)]  # [num_tokens, max_blocks]
        self.row_lens = torch.tensor(sees, dtype=torch.int32, device=device)  # [num_tokens]

    def attend_stored(self, q, k, v, k_cache, v_cache, out) -> None:
        n = self.attn_metadata.num_tokens
        out[:n] = self.ops.paged_decode_attention(q[:n], k_cache, v_cache, self.row_tables, self.row_lens)


class TritonPagedAttention(PagedAttention):
    """The decode rows through the Triton kernel (CUDA); prompt chunks as `PagedAttention` runs them."""

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, max_context_len) -> torch.Tensor:
        from .triton_paged import triton_paged_decode_attention

        return triton_paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens)
