"""`BlockManager`: hands out the paged KV cache's blocks, counts references, caches prefixes.

A sequence's `block_table[i]` is the physical block holding its tokens [i * block_size, (i + 1) * block_size).
The scheduler asks before it acts:

    if bm.can_allocate(len(seq.token_ids)): bm.allocate(seq)     # a waiting sequence starts
    if bm.can_append(seq): bm.append_slot(seq)                    # a running one gets room for its next token
    bm.cache_full_blocks(seq, num_computed_tokens)                # after the step: full blocks become reusable
    bm.free(seq)                                                  # finished, aborted or preempted

Prefix caching: a full block is named by hash(its token ids, hash of the block before), so equal hashes mean
equal prefixes. `allocate` reuses every leading cached block of a prompt (`seq.num_cached_tokens` says how many
tokens that skipped). A block is registered only once its K/V are computed, and a freed one keeps its hash: it
stays a hit until it is the least recently used free block and a new allocation evicts it.
A sequence here is anything with `token_ids`, `block_table` and `num_cached_tokens` (the engine's `Sequence`).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


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


class BlockManager:
    """Block allocator with reference counts, an LRU free queue and prefix caching."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, least recently used first (`_release` puts empty ones before cached ones).
        self.free_block_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_block_hash_to_block_id: dict[int, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found
        self.num_evictions = 0  # cached blocks dropped to make room

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
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of `num_tokens` tokens fits (ignoring prefix hits: conservative)."""
        return self.num_blocks_for(num_tokens) <= self.num_free_blocks

    def allocate(self, seq) -> None:
        """Give a new (or preempted) sequence blocks for all its tokens, reusing its cached prefix. The last token
        is never taken from the cache, so the model always has a token to compute logits from."""
        if seq.block_table:
            raise ValueError("allocate() on a sequence that already holds blocks; free() it first")
        hits = self._find_cached_blocks(seq.token_ids)
        num_new = self.num_blocks_for(len(seq.token_ids)) - len(hits)
        self._check_free(sum(self.blocks[b].ref_count == 0 for b in hits) + num_new, "can_allocate")
        for block_id in hits:  # one more user of each cached block (out of the free queue if nobody used it)
            if self.blocks[block_id].ref_count == 0:
                del self.free_block_queue[block_id]
            self.blocks[block_id].ref_count += 1
        seq.block_table = hits + [self._allocate_block() for _ in range(num_new)]
        seq.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_cache_queries += len(seq.token_ids)
            self.prefix_cache_hits += seq.num_cached_tokens

    def can_append(self, seq) -> bool:
        """Whether the sequence's tokens (incl. the one about to be computed) fit after `append_slot`."""
        return self.num_blocks_for(len(seq.token_ids)) - len(seq.block_table) <= self.num_free_blocks

    def append_slot(self, seq) -> None:
        """Add a block when the sequence's tokens outgrow its block table (at most one per decode step)."""
        missing = self.num_blocks_for(len(seq.token_ids)) - len(seq.block_table)
        self._check_free(missing, "can_append")
        seq.block_table.extend(self._allocate_block() for _ in range(missing))

    def trim(self, seq) -> None:
        """Give back the blocks past what the sequence's tokens need (the slots of rejected speculative drafts)."""
        while len(seq.block_table) > self.num_blocks_for(len(seq.token_ids)):
            self._release(seq.block_table.pop())

    def cache_full_blocks(self, seq, num_computed_tokens: int) -> None:
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

    def free(self, seq) -> None:
        """Release a finished, aborted or preempted sequence's blocks. Cached ones stay as hits."""
        for block_id in reversed(seq.block_table):  # tail first: the end of a prompt is evicted before its start
            self._release(block_id)
        seq.block_table = []
        seq.num_cached_tokens = 0

    def _release(self, block_id: int) -> None:
        """One user fewer; an unused block joins the free queue: at the back if cached, else at the front."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_queue[block_id] = None
            self.free_block_queue.move_to_end(block_id, last=block.block_hash is not None)

    def _check_free(self, needed: int, ask: str) -> None:
        if needed > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {needed}, {self.num_free_blocks} free; check {ask}() first")

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

    def _allocate_block(self) -> int:
        """Pop the least recently used free block, evicting its cached contents if any."""
        block_id, _ = self.free_block_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self.cached_block_hash_to_block_id[block.block_hash]
            self.num_evictions += 1
        block.ref_count, block.block_hash, block.token_ids = 1, None, ()
        return block_id
