"""Paged attention (PyTorch): KV memory as fixed-size blocks, read through block tables.

The engine packs every token of a step into one row, prefill chunks and decodes mixed (the picture is in
`course_lib.engine.model_runner`). Token t's K/V go to flat slot `slot_mapping[t] = block_id * block_size +
offset`. Sequence i then attends its queries over its first `context_lens[i]` cached tokens, found through
`block_tables[i]`. Decodes (one query) are batched in `paged_decode_attention`, the reference for
`course_lib.accel`'s kernels; prompt chunks in `paged_prefill_attention`, one SDPA a layer with each chunk a
row padded to the longest.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..dtypes import resolve_dtype
from ..host_copy import to_device_at_once


class PagedKVCache:
    """Preallocated KV memory for the engine: `num_blocks` blocks of `block_size` tokens per layer."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", dtype: torch.dtype | str = torch.float32):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        dtype = resolve_dtype(dtype)  # k_cache, v_cache: [layers, blocks, block_size, kv_heads, head_dim]
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.num_blocks, self.block_size = num_blocks, block_size

    @property
    def nbytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

    @property
    def device(self) -> torch.device:
        return self.k_cache.device

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int = 16, dtype: torch.dtype | str = torch.float32) -> int:
        """K and V of `block_size` tokens across all layers."""
        return block_size * config.kv_bytes_per_token(dtype)


@dataclass
class PagedAttentionMetadata:
    """Where one packed step writes and reads. Build it with `PagedAttentionMetadata.build`."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token's K/V
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32: block ids of each sequence, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32: tokens in cache after this step, incl. the new ones
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: sequence i's queries are tokens [qsl[i], qsl[i+1])
    max_query_len: int
    max_context_len: int
    context_lens_cpu: list[int]  # the same numbers on the host, so the backend never waits on the device
    query_start_loc_cpu: list[int]
    indices: "StepIndices"  # which rows are decodes and which prompt chunks, for the backend

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc_cpu[-1]

    @classmethod
    def build(cls, block_tables: list[list[int]], context_lens: list[int], query_lens: list[int],
              block_size: int, device: torch.device | str | None = "cpu") -> "PagedAttentionMetadata":
        """From host lists, one entry per sequence: its last query_lens[i] of context_lens[i] tokens are new.
        `device=None` keeps the tensors on the host, for a caller that moves them with its own (`to`)."""
        query_start_loc, slots = [0], []
        for table, ctx, q in zip(block_tables, context_lens, query_lens):
            if not 0 <= q <= ctx or ctx > len(table) * block_size:
                raise ValueError(f"need 0 <= query_len <= context_len <= blocks * block_size, "
                                 f"got query_len {q}, context_len {ctx}, {len(table)} blocks of {block_size}")
            query_start_loc.append(query_start_loc[-1] + q)
            slots += slots_for(table, range(ctx - q, ctx), block_size)
        max_blocks = max((len(t) for t in block_tables), default=0)
        padded = [t + [-1] * (max_blocks - len(t)) for t in block_tables]
        host = cls(  # every tensor on the host first, then all of them moved in one copy
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=torch.tensor(padded, dtype=torch.int32).view(len(padded), max_blocks),
            context_lens=torch.tensor(context_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32),
            max_query_len=max(query_lens, default=0), max_context_len=max(context_lens, default=0),
            context_lens_cpu=list(context_lens), query_start_loc_cpu=query_start_loc,
            indices=StepIndices.build(query_lens, query_start_loc, context_lens),
        )
        return host if device is None else host.to(device)[0]

    def to(self, device: torch.device | str, *others: torch.Tensor) -> tuple:
        """(this metadata on `device`, *others on `device`): every tensor in one host->device copy."""
        index = [getattr(self.indices, f.name) for f in fields(StepIndices)]
        moved = to_device_at_once([self.slot_mapping, self.block_tables, self.context_lens, self.query_start_loc,
                                   *index, *others], device)
        meta = replace(self, slot_mapping=moved[0], block_tables=moved[1], context_lens=moved[2],
                       query_start_loc=moved[3], indices=StepIndices(*moved[4:4 + len(index)]))
        return (meta, *moved[4 + len(index):])


@dataclass
class StepIndices:
    """Where a mixed step's decode rows and prompt chunks sit in the packed row, built on the host. Prompt
    chunks run as one padded batch, a row of `max_chunk` queries each; padding repeats a chunk's last query."""

    decode_seqs: torch.Tensor  # [num_decodes] int64: sequences with one query this step
    decode_tokens: torch.Tensor  # [num_decodes] int64: where that query sits in the row
    prefill_seqs: torch.Tensor  # [num_chunks] int64: sequences with several queries (prompt chunks)
    prefill_tokens: torch.Tensor  # [num_chunks, max_chunk] int64: where chunk i's j-th query sits in the row
    prefill_positions: torch.Tensor  # [num_chunks, max_chunk] int64: and its position in its sequence
    prefill_valid: torch.Tensor  # [num_prefill_tokens] int64: the real queries of [num_chunks * max_chunk]

    @classmethod
    def build(cls, query_lens: list[int], query_start_loc: list[int], context_lens: list[int]) -> "StepIndices":
        decodes = [i for i, n in enumerate(query_lens) if n == 1]
        chunks = [i for i, n in enumerate(query_lens) if n > 1]
        width = max((query_lens[i] for i in chunks), default=0)
        tokens, positions, valid = [], [], []
        for row, i in enumerate(chunks):
            n, start, first = query_lens[i], query_start_loc[i], context_lens[i] - query_lens[i]
            tokens.append([start + min(j, n - 1) for j in range(width)])
            positions.append([first + min(j, n - 1) for j in range(width)])
            valid += range(row * width, row * width + n)
        as_long = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
        return cls(as_long(decodes), as_long([query_start_loc[i] for i in decodes]), as_long(chunks),
                   as_long(tokens).view(len(chunks), width), as_long(positions).view(len(chunks), width),
                   as_long(valid))


def slots_for(block_table: list[int], positions, block_size: int) -> list[int]:
    """Flat cache slot of each position of one sequence: its block's id * block_size + the offset in it."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write k, v [num_tokens, kv_heads, head_dim] into flat slots of one layer's cache."""
    kv_heads, head_dim = k_cache_layer.shape[-2:]
    k_cache_layer.view(-1, kv_heads, head_dim)[slot_mapping] = k  # [num_blocks * block_size, kv_heads, head_dim]
    v_cache_layer.view(-1, kv_heads, head_dim)[slot_mapping] = v


def paged_decode_attention(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           max_context_len: int | None = None) -> torch.Tensor:
    """One query per sequence after all its context_lens cached tokens (no mask but length): the reference for
    the Triton and C++ kernels. q [num_seqs, heads, head_dim]; k/v_cache_layer [num_blocks, block_size,
    kv_heads, head_dim]; block_tables [num_seqs, max_blocks] (-1 padding allowed). Returns q's shape."""
    k, v, visible = gather_context(k_cache_layer, v_cache_layer, block_tables, context_lens, max_context_len)
    return attend_context(q, k, v, visible)


def gather_context(k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor, block_tables: torch.Tensor,
                   context_lens: torch.Tensor, max_context_len: int | None = None):
    """Each sequence's cached K/V, gathered from its blocks: k, v [num_seqs, blocks * block_size, kv_heads,
    head_dim], and visible [num_seqs, blocks * block_size], which marks its first context_lens tokens."""
    block_size, num_blocks = k_cache_layer.shape[1], block_tables.shape[1]
    if max_context_len is not None:
        num_blocks = min(num_blocks, -(-max_context_len // block_size))
    table = block_tables[:, :num_blocks].clamp(min=0).long()  # [num_seqs, blocks]; padding -> block 0, masked below
    k = gather_blocks(k_cache_layer, table)  # [num_seqs, blocks * block_size, kv_heads, head_dim]
    v = gather_blocks(v_cache_layer, table)
    visible = torch.arange(k.shape[1], device=k.device)[None, :] < context_lens[:, None]  # [num_seqs, ctx]
    return k, v, visible


def attend_context(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [num_seqs, heads, head_dim] over k, v [num_seqs, ctx, kv_heads, head_dim] where visible [num_seqs, ctx]
    -> [num_seqs, heads, head_dim]."""
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    # The query heads of one KV head act as that head's queries: [num_seqs, kv_heads, group, head_dim].
    out = F.scaled_dot_product_attention(q.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim),
                                         k.transpose(1, 2), v.transpose(1, 2), attn_mask=visible[:, None, None, :])
    return out.reshape(num_seqs, num_heads, head_dim)


def gather_blocks(cache_layer: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The blocks `table` [rows, blocks] names, each row's laid end to end: [rows, blocks * block_size, kv_heads,
    head_dim]. One `index_select` of whole blocks, cheaper than indexing the 4-d cache."""
    num_blocks, block_size, kv_heads, head_dim = cache_layer.shape
    rows = cache_layer.view(num_blocks, -1).index_select(0, table.flatten())  # [rows * blocks, block elements]
    return rows.view(table.shape[0], table.shape[1] * block_size, kv_heads, head_dim)


def paged_prefill_attention(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                            block_tables: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """Several prompt chunks at once, each a row of a padded batch, over their stored context. q [num_chunks,
    max_chunk, heads, head_dim]; block_tables [num_chunks, max_blocks]; visible [num_chunks, max_chunk, width]
    (`prefill_mask`), or None for one whole prompt: plain causal. Returns q's shape. K/V are expanded to the
    query heads, as `causal_attention` does under a mask (SDPA's GQA with a mask falls back to the math kernel)."""
    width = q.shape[1] if visible is None else visible.shape[-1]
    table = block_tables[:, :-(-width // k_cache_layer.shape[1])].clamp(min=0).long()  # [num_chunks, blocks]
    group = q.shape[2] // k_cache_layer.shape[2]
    k, v = (gather_blocks(cache, table)[:, :width].repeat_interleave(group, dim=2)  # [chunks, width, heads, d]
            for cache in (k_cache_layer, v_cache_layer))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [chunks, heads, seq, head_dim]
    if visible is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None])  # [chunks, heads, max_chunk, d]
    return out.transpose(1, 2)


def prefill_mask(positions: torch.Tensor, max_context_len: int, block_size: int) -> torch.Tensor:
    """positions [num_chunks, max_chunk] -> visible [num_chunks, max_chunk, width]: key t <= query position,
    causal and prefix-aware at once; width rounds the longest context up to whole blocks."""
    keys = torch.arange(-(-max_context_len // block_size) * block_size, device=positions.device)  # [width]
    return keys[None, None, :] <= positions[:, :, None]


class PagedAttention:
    """Attention backend over a `PagedKVCache` for one packed step described by `attn_metadata`: each layer
    stores its new K/V, then attends (`attend_stored`). `course_lib.accel` subclasses it to run its kernels."""

    def __init__(self, kv_cache: PagedKVCache, attn_metadata: PagedAttentionMetadata):
        self.kv_cache, self.attn_metadata = kv_cache, attn_metadata
        qsl, ctx = attn_metadata.query_start_loc_cpu, attn_metadata.context_lens_cpu
        self.query_lens = [b - a for a, b in zip(qsl, qsl[1:])]
        decodes = [i for i, n in enumerate(self.query_lens) if n == 1]
        chunks = [i for i, n in enumerate(self.query_lens) if n > 1]
        self.num_decodes, self.num_chunks = len(decodes), len(chunks)
        self.all_decode = len(decodes) == len(ctx) > 0
        self.decode_max_context_len = max((ctx[i] for i in decodes), default=0)
        if chunks:  # built once per step, shared by every layer
            ix = attn_metadata.indices
            whole_prompt = len(chunks) == 1 and ctx[chunks[0]] == self.query_lens[chunks[0]]
            self.prefill_visible = None if whole_prompt else prefill_mask(  # [num_chunks, max_chunk, width]
                ix.prefill_positions, max(ctx[i] for i in chunks), kv_cache.block_size)
            self.prefill_out_tokens = ix.prefill_tokens.flatten()[ix.prefill_valid]  # [num_prefill_tokens]

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, num_tokens, heads, head_dim], k/v [1, num_tokens, kv_heads, head_dim] -> q's shape."""
        shape = q.shape
        q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))  # [num_tokens, (kv_)heads, head_dim]
        k_cache, v_cache = self.kv_cache.k_cache[layer_idx], self.kv_cache.v_cache[layer_idx]
        store_kvcache(k, v, k_cache, v_cache, self.attn_metadata.slot_mapping)  # this step's K/V at their slots
        out = torch.empty_like(q)
        self.attend_stored(q, k, v, k_cache, v_cache, out)
        return out.view(shape)

    def attend_stored(self, q, k, v, k_cache, v_cache, out) -> None:
        """Fill out [num_tokens, heads, head_dim] with each query's attention over its sequence's stored K/V."""
        md = self.attn_metadata
        if self.all_decode:  # a decode-only step: the row is one query per sequence, in order
            n = md.num_seqs
            out[:n] = self.decode_attention(q[:n], k_cache, v_cache, md.block_tables, md.context_lens,
                                            md.max_context_len)
        elif self.num_decodes:
            s, t = md.indices.decode_seqs, md.indices.decode_tokens
            out[t] = self.decode_attention(q[t], k_cache, v_cache, md.block_tables[s], md.context_lens[s],
                                           self.decode_max_context_len)
        if self.num_chunks:  # every prompt chunk in one padded batch
            ix = md.indices
            chunks = paged_prefill_attention(q[ix.prefill_tokens], k_cache, v_cache,  # q: [chunks, max_chunk, h, d]
                                             md.block_tables[ix.prefill_seqs], self.prefill_visible)
            out[self.prefill_out_tokens] = chunks.flatten(0, 1)[ix.prefill_valid]

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, max_context_len) -> torch.Tensor:
        """The decode rows' attention: `paged_decode_attention` (a kernel, in `course_lib.accel`'s subclasses)."""
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, max_context_len)

    def advance(self, num_tokens: int) -> None:
        """Nothing to do: the engine tracks each sequence's length and passes positions."""
