"""BlockManager: allocation round trips, reference counts, prefix caching, LRU eviction."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from course_lib.engine.block_manager import BlockManager


@dataclass
class Seq:
    """The smallest object satisfying the BlockManager's sequence protocol."""

    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0


def run_prefill(bm: BlockManager, seq: Seq) -> None:
    """Allocate, then pretend the model computed every token (as the engine does after a step)."""
    bm.allocate(seq)
    bm.cache_full_blocks(seq, len(seq.token_ids))


def test_allocate_free_round_trip_no_leak():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    seqs = [Seq(list(range(n))) for n in (1, 4, 5, 9)]  # 1 + 1 + 2 + 3 blocks
    for s in seqs:
        assert bm.can_allocate(len(s.token_ids))
        bm.allocate(s)
        assert len(s.block_table) == -(-len(s.token_ids) // 4)
    assert bm.num_used_blocks == 7 and bm.num_free_blocks == 3
    all_ids = [b for s in seqs for b in s.block_table]
    assert len(set(all_ids)) == len(all_ids)  # no block handed out twice
    for s in seqs:
        bm.free(s)
        assert s.block_table == []
    assert bm.num_free_blocks == 10 and bm.num_used_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_append_slot_grows_one_block_at_block_boundary():
    bm = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=False)
    s = Seq([1, 2, 3])
    bm.allocate(s)
    s.token_ids.append(4)  # fills block 0: no new block
    assert bm.can_append(s)
    bm.append_slot(s)
    assert len(s.block_table) == 1
    s.token_ids.append(5)  # token 5 needs block 1
    bm.append_slot(s)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 1
    other = Seq([9] * 4)
    bm.allocate(other)  # takes the last block
    s.token_ids += [6, 7, 8, 9]  # token 9 needs a third block: none left
    assert not bm.can_append(s)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.append_slot(s)
    bm.free(other)
    assert bm.can_append(s)
    bm.append_slot(s)
    bm.free(s)
    assert bm.num_free_blocks == 3


def test_can_allocate_false_when_out_of_blocks():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.can_allocate(16) and not bm.can_allocate(17)
    a = Seq(list(range(12)))
    bm.allocate(a)
    assert bm.can_allocate(4) and not bm.can_allocate(5)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(Seq(list(range(100, 108))))
    assert bm.num_free_blocks == 1  # the failed allocate changed nothing


def test_shared_prefix_ref_counts_and_hits():
    bm = BlockManager(num_blocks=16, block_size=4)
    prefix = list(range(100, 108))  # two full blocks
    a = Seq(prefix + [1, 2, 3])
    run_prefill(bm, a)
    assert a.num_cached_tokens == 0 and bm.num_cached_blocks == 2  # the partial third block is not cached

    b = Seq(prefix + [7, 8, 9, 10, 11])
    bm.allocate(b)
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 3 + 2  # b took two new blocks only
    assert bm.prefix_cache_queries == 11 + 13 and bm.prefix_cache_hits == 8
    assert bm.prefix_cache_hit_rate == pytest.approx(8 / 24)

    bm.cache_full_blocks(b, len(b.token_ids))  # b's third block [7, 8, 9, 10] is full and computed
    assert bm.num_cached_blocks == 3
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]  # still held by b
    bm.free(b)
    assert bm.num_free_blocks == 16 and all(blk.ref_count == 0 for blk in bm.blocks)
    assert bm.num_cached_blocks == 3  # freed blocks stay cached


def test_cached_blocks_survive_free_and_are_reused():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(13))  # 3 full blocks + 1 token
    a = Seq(list(prompt))
    run_prefill(bm, a)
    first_blocks = list(a.block_table[:3])
    bm.free(a)
    assert bm.num_used_blocks == 0
    b = Seq(list(prompt))
    bm.allocate(b)
    assert b.block_table[:3] == first_blocks and b.num_cached_tokens == 12
    assert bm.num_used_blocks == 4


def test_last_token_never_comes_from_cache():
    bm = BlockManager(num_blocks=8, block_size=4)
    run_prefill(bm, Seq(list(range(8))))  # exactly two full blocks, both cached
    again = Seq(list(range(8)))
    bm.allocate(again)
    assert again.num_cached_tokens == 4  # the second block holds the last token: recomputed


def test_different_prefix_same_block_tokens_misses():
    bm = BlockManager(num_blocks=8, block_size=2)
    run_prefill(bm, Seq([1, 2, 3, 4, 5]))
    other = Seq([9, 9, 3, 4, 5])  # block 1 has the same tokens but a different parent
    bm.allocate(other)
    assert other.num_cached_tokens == 0


def test_decode_fills_block_and_cache_full_blocks_registers_it():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = Seq([1, 2, 3])
    run_prefill(bm, a)
    assert bm.num_cached_blocks == 0
    a.token_ids.append(4)  # sampled; computed in the next step
    bm.append_slot(a)
    bm.cache_full_blocks(a, 3)
    assert bm.num_cached_blocks == 0  # token 4's K/V not computed yet
    bm.cache_full_blocks(a, 4)
    assert bm.num_cached_blocks == 1
    b = Seq([1, 2, 3, 4, 5])
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[0] == a.block_table[0]


def test_lru_eviction_of_cached_blocks():
    bm = BlockManager(num_blocks=6, block_size=2)
    old, new = Seq([1, 2, 3, 4, 0]), Seq([5, 6, 7, 8, 0])  # 2 cacheable blocks + 1 partial each
    run_prefill(bm, old)
    run_prefill(bm, new)
    bm.free(old)  # old's blocks are now the least recently used
    bm.free(new)
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 4
    filler = Seq(list(range(100, 104)))  # needs 2 blocks: the 2 empty partial blocks go first
    bm.allocate(filler)
    assert bm.num_evictions == 0 and bm.num_cached_blocks == 4
    bm.free(filler)
    filler = Seq(list(range(100, 104)))
    bm.allocate(filler)  # both empty blocks again: still no eviction
    big = Seq(list(range(200, 204)))  # now 2 cached blocks must go: old's, the least recently used
    bm.allocate(big)
    assert bm.num_evictions == 2
    probe_old, probe_new = Seq([1, 2, 3, 4, 0]), Seq([5, 6, 7, 8, 0])
    assert [b.block_hash is not None for b in bm.blocks].count(True) == 2
    bm.free(big)
    bm.free(filler)
    bm.allocate(probe_new)
    assert probe_new.num_cached_tokens == 4  # the recently used prefix survived
    bm.allocate(probe_old)
    assert probe_old.num_cached_tokens == 0  # the old one was evicted


def test_hit_on_free_cached_block_takes_it_out_of_the_free_queue():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = Seq([1, 2, 3])
    run_prefill(bm, a)
    bm.free(a)
    b = Seq([1, 2, 9])
    bm.allocate(b)  # reuses the cached block, so it cannot be handed out again
    assert b.num_cached_tokens == 2 and bm.num_free_blocks == 1
    c = Seq([7])
    bm.allocate(c)
    assert c.block_table[0] not in b.block_table
    for s in (b, c):
        bm.free(s)
    assert bm.num_free_blocks == 3


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    run_prefill(bm, Seq([1, 2, 3, 4, 5]))
    b = Seq([1, 2, 3, 4, 5])
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and bm.num_cached_blocks == 0 and bm.prefix_cache_queries == 0


def test_free_puts_the_tail_of_a_prefix_first_in_line_for_eviction():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = Seq([1, 2, 3, 4, 5, 6, 0])  # 3 cacheable blocks + 1 partial
    run_prefill(bm, a)
    bm.free(a)
    fillers = [Seq([7, 8]), Seq([9, 9])]
    for f in fillers:  # the first takes the empty partial block, the second must evict a cached one
        bm.allocate(f)
    assert bm.num_evictions == 1
    for f in fillers:
        bm.free(f)
    probe = Seq([1, 2, 3, 4, 5, 6, 0])
    bm.allocate(probe)
    assert probe.num_cached_tokens == 4  # [1, 2] and [3, 4] survive; the tail block [5, 6] was evicted


def test_hash_collision_is_not_a_hit(monkeypatch):
    import course_lib.engine.block_manager as block_manager

    monkeypatch.setattr(block_manager, "compute_block_hash", lambda tokens, parent: 42)  # every block collides
    bm = BlockManager(num_blocks=8, block_size=2)
    run_prefill(bm, Seq([1, 2, 3]))
    other = Seq([5, 6, 7])
    bm.allocate(other)
    assert other.num_cached_tokens == 0  # same hash, different tokens: recomputed
