"""`BlockManager`: hands out the paged KV cache's blocks, counts references, caches prefixes.

The KV memory (`course_lib.attention.paged.PagedKVCache`) is `num_blocks` blocks of `block_size`
tokens. A sequence's `block_table[i]` is the physical block holding its tokens
[i * block_size, (i + 1) * block_size). The scheduler asks before it acts:

    if bm.can_allocate(len(seq.token_ids)): bm.allocate(seq)     # a waiting sequence starts
    if bm.can_append(seq): bm.append_slot(seq)                    # a running one gets room for its next token
    bm.cache_full_blocks(seq, num_computed_tokens)                # after the step: full blocks become reusable
    bm.free(seq)                                                  # finished, aborted or preempted

Prefix caching: a full block is named by hash(its token ids, hash of the block before), so equal
hashes mean equal prefixes. `allocate` walks the prompt's full blocks and reuses every leading one
already cached (reference count + 1, no recompute); `seq.num_cached_tokens` says how many tokens
that skipped. A block is registered in the cache only once its K/V have been computed
(`cache_full_blocks`), so no one ever reads a block still being filled. A freed block keeps its
hash: it waits in the free queue, still a cache hit, until it is the least recently used one and a
new allocation evicts it.

Sequence protocol (the engine's `Sequence` satisfies it; a plain dataclass does in the tests):

    token_ids: list[int]      # prompt + generated tokens; the last one may not be computed yet
    block_table: list[int]    # physical block ids; written only by the BlockManager
    num_cached_tokens: int    # written by `allocate`: leading tokens found in the prefix cache
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol


class SequenceLike(Protocol):
    """What the BlockManager reads and writes on a sequence (see the module docstring)."""

    token_ids: list[int]
    block_table: list[int]
    num_cached_tokens: int


def compute_block_hash(token_ids: list[int] | tuple[int, ...], parent_hash: int | None) -> int:
    """Hash of a full block: its token ids chained to the hash of the block before (None for the first)."""
    return hash((parent_hash, tuple(token_ids)))


@dataclass
class Block:
    """One physical KV block: who uses it and, once full and computed, which tokens it holds."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set when registered in the prefix cache
    token_ids: tuple[int, ...] = field(default=(), repr=False)  # checked on a hit, against hash collisions

    def reset(self) -> None:
        self.ref_count, self.block_hash, self.token_ids = 0, None, ()


class BlockManager:
    """Block allocator with reference counts, an LRU free queue and prefix caching."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, least recently used first. Cached ones (with a hash) are still
        # hits until popped; empty ones are put at the front so they are reused before cached ones.
        self.free_block_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_block_hash_to_block_id: dict[int, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found
        self.num_evictions = 0  # cached blocks dropped to make room

    # ---- counters -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (cached ones included: they are evicted on demand)."""
        return len(self.free_block_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, in use or not."""
        return len(self.cached_block_hash_to_block_id)

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens looked up (0 before any lookup)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    # ---- allocation -----------------------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of `num_tokens` tokens fits (ignoring prefix hits: conservative)."""
        return self.num_blocks_for(num_tokens) <= self.num_free_blocks

    def allocate(self, seq: SequenceLike) -> None:
        """Give a new (or preempted) sequence blocks for all its tokens, reusing its cached prefix.

        Sets `seq.block_table` and `seq.num_cached_tokens`. The last token is never taken from the
        cache, so the model always has at least one token to compute logits from.
        """
        if seq.block_table:
            raise ValueError("allocate() on a sequence that already holds blocks; free() it first")
        num_tokens = len(seq.token_ids)
        hits = self._find_cached_blocks(seq.token_ids)
        num_new = self.num_blocks_for(num_tokens) - len(hits)
        taken_from_free = sum(self.blocks[b].ref_count == 0 for b in hits) + num_new
        if taken_from_free > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {taken_from_free}, {self.num_free_blocks} free; "
                               f"check can_allocate() first")
        for block_id in hits:
            self._take(block_id)
        seq.block_table = hits + [self._allocate_block() for _ in range(num_new)]
        seq.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += seq.num_cached_tokens

    def can_append(self, seq: SequenceLike) -> bool:
        """Whether the sequence's tokens (incl. the one about to be computed) fit after `append_slot`."""
        missing = self.num_blocks_for(len(seq.token_ids)) - len(seq.block_table)
        return missing <= self.num_free_blocks

    def append_slot(self, seq: SequenceLike) -> None:
        """Add a block when the sequence's tokens outgrow its block table (at most one per decode step)."""
        missing = self.num_blocks_for(len(seq.token_ids)) - len(seq.block_table)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {missing}, {self.num_free_blocks} free; "
                               f"check can_append() first")
        seq.block_table.extend(self._allocate_block() for _ in range(missing))

    def trim(self, seq: SequenceLike) -> int:
        """Give back the blocks past what the sequence's tokens need (speculative decoding: the slots of rejected
        drafts); returns how many. They were never registered in the prefix cache: back to the free queue."""
        extra = len(seq.block_table) - self.num_blocks_for(len(seq.token_ids))
        for _ in range(max(0, extra)):
            block = self.blocks[seq.block_table.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_queue[block.block_id] = None
                self.free_block_queue.move_to_end(block.block_id, last=block.block_hash is not None)
        return max(0, extra)

    def cache_full_blocks(self, seq: SequenceLike, num_computed_tokens: int) -> None:
        """Register the sequence's full blocks whose K/V are now computed, so later prompts can reuse them."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed_tokens, len(seq.token_ids)) // self.block_size
        first = num_full  # walk back to the last block already registered: each call costs O(new blocks)
        while first > 0 and self.blocks[seq.block_table[first - 1]].block_hash is None:
            first -= 1
        parent = self.blocks[seq.block_table[first - 1]].block_hash if first > 0 else None
        for i in range(first, num_full):
            block = self.blocks[seq.block_table[i]]
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            block_hash = compute_block_hash(tokens, parent)
            # If a twin sequence computed the same tokens first, that block is the cached one and
            # this block stays unregistered; the chain goes on with the (equal) hash either way.
            if block_hash not in self.cached_block_hash_to_block_id:
                block.block_hash, block.token_ids = block_hash, tokens
                self.cached_block_hash_to_block_id[block_hash] = block.block_id
            parent = block_hash

    def free(self, seq: SequenceLike) -> None:
        """Release a finished, aborted or preempted sequence's blocks. Cached ones stay as hits."""
        for block_id in reversed(seq.block_table):  # tail first: the end of a prompt is evicted before its start
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_queue[block_id] = None
                if block.block_hash is None:
                    self.free_block_queue.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_cached_tokens = 0

    # ---- internals ------------------------------------------------------------------------
    def _find_cached_blocks(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest cached prefix, in full blocks, stopping before the last token."""
        if not self.enable_prefix_caching:
            return []
        hits, parent = [], None
        for i in range((len(token_ids) - 1) // self.block_size):
            tokens = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            parent = compute_block_hash(tokens, parent)
            block_id = self.cached_block_hash_to_block_id.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    def _take(self, block_id: int) -> None:
        """One more user of a cached block (out of the free queue if nobody used it)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_queue[block_id]
        block.ref_count += 1

    def _allocate_block(self) -> int:
        """Pop the least recently used free block, evicting its cached contents if any."""
        block_id, _ = self.free_block_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self.cached_block_hash_to_block_id[block.block_hash]
            self.num_evictions += 1
        block.reset()
        block.ref_count = 1
        return block_id
