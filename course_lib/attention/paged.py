"""Paged attention (PyTorch): KV memory as fixed-size blocks, read through block tables.

    PagedKVCache      k_cache, v_cache [num_layers, num_blocks, block_size, kv_heads, head_dim]
    PagedAttentionMetadata   where this step's tokens go (slot_mapping) and what each sequence reads
                             (block_tables, context_lens, query_start_loc)
    PagedAttention    the backend the model's attention layers call: write K/V, then attend

The engine packs every token of a step into one row, prefill chunks and decodes mixed:

    input_ids [1, num_tokens] = [ seq 0 chunk ........ | seq 1 decode | seq 2 chunk ... | ... ]
    query_start_loc           = [0,                     q0,            q0+1,             ...]

Token t's K/V go to flat slot `slot_mapping[t] = block_id * block_size + offset`. Sequence i then
attends its queries over its first `context_lens[i]` cached tokens, found through `block_tables[i]`;
its j-th query sits at position `context_lens[i] - num_queries + j` (causal). Rows with one query
(decodes) are batched in `paged_decode_attention`, the reference for the kernels of `course_lib.accel`
(Triton on the GPU, C++ on the CPU), which subclass `PagedAttention`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..dtypes import resolve_dtype
from . import causal_attention


class PagedKVCache:
    """Preallocated KV memory for the engine: `num_blocks` blocks of `block_size` tokens per layer."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", dtype: torch.dtype | str = torch.float32):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        dtype = resolve_dtype(dtype)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)  # [layers, blocks, block_size, kv_heads, head_dim]
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.num_blocks, self.block_size = num_blocks, block_size

    @property
    def nbytes(self) -> int:
        """Bytes held by K and V together."""
        return self.k_cache.nbytes + self.v_cache.nbytes

    @property
    def device(self) -> torch.device:
        return self.k_cache.device

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int = 16,
                        dtype: torch.dtype | str = torch.float32) -> int:
        """K and V of `block_size` tokens across all layers."""
        return block_size * config.kv_bytes_per_token(dtype)

    @staticmethod
    def num_blocks_for_memory(config: ModelConfig, kv_cache_memory: int | float, block_size: int = 16,
                              device: torch.device | str = "cpu",
                              dtype: torch.dtype | str = torch.float32) -> int:
        """How many blocks fit in `kv_cache_memory`: bytes (int), or a fraction (float) of free CUDA memory."""
        device = torch.device(device)
        if isinstance(kv_cache_memory, float):
            if not 0.0 < kv_cache_memory <= 1.0:
                raise ValueError(f"kv_cache_memory as a fraction must be in (0, 1], got {kv_cache_memory}")
            if device.type != "cuda":
                raise ValueError("kv_cache_memory as a fraction of free GPU memory needs a CUDA device; "
                                 "on the CPU pass a byte budget (int)")
            free, _ = torch.cuda.mem_get_info(device)
            budget = int(free * kv_cache_memory)
        else:
            budget = int(kv_cache_memory)
        per_block = PagedKVCache.bytes_per_block(config, block_size, dtype)
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory={kv_cache_memory!r} ({budget} bytes) holds no KV block "
                             f"of {per_block} bytes ({block_size} tokens); raise the budget")
        return num_blocks

    @classmethod
    def from_memory(cls, config: ModelConfig, kv_cache_memory: int | float, block_size: int = 16,
                    device: torch.device | str = "cpu",
                    dtype: torch.dtype | str = torch.float32) -> "PagedKVCache":
        """A cache with as many blocks as `kv_cache_memory` (bytes, or fraction of free GPU memory) allows."""
        num_blocks = cls.num_blocks_for_memory(config, kv_cache_memory, block_size, device, dtype)
        return cls(config, num_blocks, block_size, device, dtype)


@dataclass
class PagedAttentionMetadata:
    """Where one packed step writes and reads. Build it with `PagedAttentionMetadata.build`."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token's K/V; -1 = skip
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32: block ids of each sequence, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32: tokens in cache after this step, incl. the new ones
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: sequence i's queries are tokens [qsl[i], qsl[i+1])
    max_query_len: int
    max_context_len: int
    context_lens_cpu: list[int]  # the same numbers on the host, so the backend never waits on the device
    query_start_loc_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_cpu)

    @property
    def num_tokens(self) -> int:
        """Query tokens of all sequences (the packed row may hold padding after them)."""
        return self.query_start_loc_cpu[-1]

    @classmethod
    def build(cls, block_tables: list[list[int]], context_lens: list[int], query_lens: list[int],
              block_size: int, device: torch.device | str = "cpu",
              slot_mapping: list[int] | None = None) -> "PagedAttentionMetadata":
        """From host lists, one entry per sequence in packing order.

        query_lens[i] new tokens of sequence i are the last ones of its context_lens[i]; their slots
        follow from its block table unless `slot_mapping` is given (e.g. with -1 for padding).
        """
        if not (len(block_tables) == len(context_lens) == len(query_lens)):
            raise ValueError("block_tables, context_lens and query_lens need one entry per sequence")
        query_start_loc, slots = [0], []
        for table, ctx, q in zip(block_tables, context_lens, query_lens):
            if not 0 <= q <= ctx or ctx > len(table) * block_size:
                raise ValueError(f"need 0 <= query_len <= context_len <= blocks * block_size, "
                                 f"got query_len {q}, context_len {ctx}, {len(table)} blocks of {block_size}")
            query_start_loc.append(query_start_loc[-1] + q)
            slots += slots_for(table, range(ctx - q, ctx), block_size)
        if slot_mapping is not None:
            if len(slot_mapping) < query_start_loc[-1]:
                raise ValueError(f"slot_mapping has {len(slot_mapping)} slots for {query_start_loc[-1]} tokens")
            slots = slot_mapping
        max_blocks = max((len(t) for t in block_tables), default=0)
        padded = [t + [-1] * (max_blocks - len(t)) for t in block_tables]
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device).view(len(padded), max_blocks),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
            max_query_len=max(query_lens, default=0),
            max_context_len=max(context_lens, default=0),
            context_lens_cpu=list(context_lens),
            query_start_loc_cpu=query_start_loc,
        )


def slots_for(block_table: list[int], positions, block_size: int) -> list[int]:
    """Flat cache slot of each position of one sequence: its block's id * block_size + the offset in it."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write k, v [num_tokens, kv_heads, head_dim] into flat slots of one layer's cache (slot -1: skip)."""
    kv_heads, head_dim = k_cache_layer.shape[-2:]
    k_flat = k_cache_layer.view(-1, kv_heads, head_dim)  # [num_blocks * block_size, kv_heads, head_dim]
    v_flat = v_cache_layer.view(-1, kv_heads, head_dim)
    k_flat[slot_mapping] = k
    v_flat[slot_mapping] = v


def paged_decode_attention(q: torch.Tensor, k_cache_layer: torch.Tensor, v_cache_layer: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
                           max_context_len: int | None = None) -> torch.Tensor:
    """One query token per sequence over its paged context: the reference for the Triton and C++ kernels.

    q [num_seqs, heads, head_dim]; k/v_cache_layer [num_blocks, block_size, kv_heads, head_dim];
    block_tables [num_seqs, max_blocks] (entries past a sequence's context are ignored; -1 allowed);
    context_lens [num_seqs]: cached tokens each sequence attends to. With k_new, v_new [num_seqs, kv_heads,
    head_dim], each also attends to one more token not yet in the cache, after its cached ones (then a
    context_len may be 0). The query sits after all its context: no mask but length.
    Returns [num_seqs, heads, head_dim].
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache_layer.shape[1], k_cache_layer.shape[2]
    num_blocks = block_tables.shape[1]
    if max_context_len is not None:
        num_blocks = min(num_blocks, -(-max_context_len // block_size))
    table = block_tables[:, :num_blocks].clamp(min=0).long()  # [num_seqs, blocks]; padding -> block 0, masked below
    k = gather_blocks(k_cache_layer, table)  # [num_seqs, blocks * block_size, kv_heads, head_dim]
    v = gather_blocks(v_cache_layer, table)
    visible = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens[:, None]  # [num_seqs, ctx]
    if k_new is not None:  # the new token last, always visible
        k, v = torch.cat([k, k_new[:, None]], 1), torch.cat([v, v_new[:, None]], 1)
        visible = torch.cat([visible, visible.new_ones(num_seqs, 1)], 1)
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


class PagedAttention:
    """Attention backend over a `PagedKVCache` for one packed step described by `attn_metadata`.

    Pass it as `Transformer.forward(input_ids [1, num_tokens], positions [1, num_tokens], kv=...)`. Each layer
    stores its new K/V (`store`), then attends (`attend_stored`): decode rows together through
    `decode_attention`, each prompt chunk through `causal_attention`. `course_lib.accel` subclasses it to run
    its kernels in those two places.
    """

    def __init__(self, kv_cache: PagedKVCache, attn_metadata: PagedAttentionMetadata):
        self.kv_cache, self.attn_metadata = kv_cache, attn_metadata
        md, device = attn_metadata, kv_cache.device
        qsl = md.query_start_loc_cpu
        self.query_lens = [qsl[i + 1] - qsl[i] for i in range(md.num_seqs)]
        decodes = [i for i, n in enumerate(self.query_lens) if n == 1]
        self.prefill_seqs = [i for i, n in enumerate(self.query_lens) if n > 1]  # chunks, looped over
        self.all_decode = len(decodes) == md.num_seqs and md.num_seqs > 0
        self.decode_seq_indices = torch.tensor(decodes, dtype=torch.int64, device=device)  # [num_decodes]
        self.decode_token_indices = torch.tensor([qsl[i] for i in decodes], dtype=torch.int64, device=device)
        self.decode_max_context_len = max((md.context_lens_cpu[i] for i in decodes), default=0)
        self.skip_slots = bool((md.slot_mapping < 0).any())  # one host sync per step, not per layer
        self.done = False

    @property
    def seq_len(self) -> int:
        """Position where this step's tokens start (one sequence only; the engine passes positions)."""
        md = self.attn_metadata
        if md.num_seqs != 1:
            raise ValueError("a packed batch of several sequences has no single seq_len: "
                             "pass `positions` to Transformer.forward")
        return md.context_lens_cpu[0] - (0 if self.done else md.num_tokens)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [batch, seq, heads, head_dim], k/v [batch, seq, kv_heads, head_dim] -> [batch, seq, heads, head_dim].

        The packed row is batch * seq tokens (batch is 1 in the engine).
        """
        md = self.attn_metadata
        shape = q.shape
        q = q.reshape(-1, *shape[2:])  # [num_tokens, heads, head_dim]
        k = k.reshape(-1, *k.shape[2:])  # [num_tokens, kv_heads, head_dim]
        v = v.reshape(-1, *v.shape[2:])
        if q.shape[0] < max(md.num_tokens, md.slot_mapping.shape[0]):
            raise ValueError(f"packed row has {q.shape[0]} tokens; metadata describes {md.num_tokens} "
                             f"queries and {md.slot_mapping.shape[0]} slots")
        k_cache, v_cache = self.kv_cache.k_cache[layer_idx], self.kv_cache.v_cache[layer_idx]
        self.store(k, v, k_cache, v_cache)
        out = q.new_zeros(q.shape) if q.shape[0] > md.num_tokens else torch.empty_like(q)  # padding rows: zeros
        self.attend_stored(q, k, v, k_cache, v_cache, out)
        return out.view(shape)

    def store(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Write this step's K/V [num_tokens, kv_heads, head_dim] at their slots (a slot of -1: skip)."""
        slots = self.attn_metadata.slot_mapping  # may be shorter than the row: trailing padding writes nothing
        new_k, new_v = k[:slots.shape[0]], v[:slots.shape[0]]  # [num_slots, kv_heads, head_dim]
        if self.skip_slots:
            keep = slots >= 0  # [num_slots]
            new_k, new_v, slots = new_k[keep], new_v[keep], slots[keep]
        store_kvcache(new_k, new_v, k_cache, v_cache, slots)

    def attend_stored(self, q, k, v, k_cache, v_cache, out) -> None:
        """Fill out [num_tokens, heads, head_dim] with each query's attention over its sequence's stored K/V."""
        md = self.attn_metadata
        if self.all_decode:  # a decode-only step: the row is one query per sequence, in order
            n = md.num_seqs
            out[:n] = self.decode_attention(q[:n], k_cache, v_cache, md.block_tables, md.context_lens,
                                            md.max_context_len)
        elif self.decode_seq_indices.numel():
            s, t = self.decode_seq_indices, self.decode_token_indices
            out[t] = self.decode_attention(q[t], k_cache, v_cache, md.block_tables[s], md.context_lens[s],
                                           self.decode_max_context_len)
        for i in self.prefill_seqs:
            start, end = md.query_start_loc_cpu[i], md.query_start_loc_cpu[i + 1]
            ctx = md.context_lens_cpu[i]
            if ctx == end - start:  # the whole context is this step's tokens: its keys are in the row already
                keys, values = k[start:end], v[start:end]  # [ctx, kv_heads, head_dim]
            else:  # a later chunk of a prompt (or one after a cached prefix): read the earlier tokens back
                blocks = md.block_tables[i:i + 1, :-(-ctx // self.kv_cache.block_size)].long()  # [1, blocks]
                keys = gather_blocks(k_cache, blocks)[0, :ctx]  # [ctx, kv_heads, head_dim]
                values = gather_blocks(v_cache, blocks)[0, :ctx]
            chunk = causal_attention(q[None, start:end], keys[None], values[None], start=ctx - (end - start))
            out[start:end] = chunk[0]  # [num_queries, heads, head_dim], in the row's dtype

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, max_context_len) -> torch.Tensor:
        """The decode rows' attention: `paged_decode_attention` (a kernel, in `course_lib.accel`'s subclasses)."""
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens,
                                      max_context_len=max_context_len)

    def advance(self, num_tokens: int) -> None:
        """Called by the model once per forward; the engine tracks each sequence's length itself."""
        self.done = True
