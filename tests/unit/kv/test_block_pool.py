import pytest

from pdmesh.kv.block_hash import BlockHash, BlockHasher
from pdmesh.kv.block_pool import BlockPool
from pdmesh.kv.events import AllBlocksCleared, BlockRemoved, BlockStored

H = BlockHasher(block_size=2)


def cache(pool: BlockPool, blocks, tokens: list[int]) -> list[BlockHash]:  # type: ignore[no-untyped-def]
    hashes = H.hash_tokens(tokens)
    pool.cache_blocks(blocks, hashes, [tokens[i : i + 2] for i in range(0, len(tokens), 2)], None)
    return hashes


def test_allocation_takes_lowest_ids_first_and_returns_none_when_full() -> None:
    pool = BlockPool(4)
    got = pool.get_new_blocks(3)
    assert got is not None and [b.block_id for b in got] == [0, 1, 2]
    assert pool.get_new_blocks(2) is None  # capacity: not an error
    assert pool.stats().used == 3 and pool.stats().free == 1


def test_freed_blocks_are_evicted_in_lru_order_tail_first() -> None:
    pool = BlockPool(6)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    assert a is not None and b is not None
    ha = cache(pool, a, [1, 2, 3, 4, 5, 6])
    cache(pool, b, [7, 8, 9, 10])
    pool.free_blocks(reversed(a))  # a request frees its tail first
    pool.free_blocks(reversed(b))
    assert pool.stats().cached == 5 and pool.stats().used == 0
    # The never-used block 5 goes first, then a's tail (2), then a's middle (1).
    order = [pool.get_new_blocks(1)[0].block_id for _ in range(3)]  # type: ignore[index]
    assert order == [5, 2, 1]
    events = pool.take_events()
    assert isinstance(events[0], BlockStored) and events[0].block_hashes == tuple(ha)
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [(ha[2],), (ha[1],)]


def test_touch_revives_a_cached_block_and_lookup_checks_tokens() -> None:
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    assert blocks is not None
    hashes = cache(pool, blocks, [1, 2, 3, 4])
    pool.free_blocks(reversed(blocks))
    hit = pool.lookup(hashes[0], [1, 2])
    assert hit is blocks[0]
    # A (forced) hash collision with different tokens is a miss, never wrong KV.
    assert pool.lookup(hashes[0], [9, 9]) is None
    pool.touch([hit])
    assert hit.ref_cnt == 1 and pool.num_free_blocks == 2
    s = pool.stats()
    assert (s.used, s.cached, s.free) == (1, 1, 1)


def test_duplicate_content_keeps_the_first_block_as_entry() -> None:
    pool = BlockPool(4)
    a = pool.get_new_blocks(1)
    b = pool.get_new_blocks(1)
    assert a is not None and b is not None
    h = cache(pool, a, [5, 6])
    cache(pool, b, [5, 6])
    assert pool.cached[h[0]] is a[0] and b[0].block_hash is None
    pool.free_blocks(b)
    assert pool.stats().free == 3 and pool.stats().cached == 0


def test_double_free_is_a_broken_invariant() -> None:
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(1)
    assert blocks is not None
    pool.free_blocks(blocks)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free_blocks(blocks)


def test_reset_prefix_cache() -> None:
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(1)
    assert blocks is not None
    cache(pool, blocks, [1, 2])
    assert not pool.reset_prefix_cache()  # refused while in use
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert pool.stats().cached == 0 and isinstance(pool.take_events()[-1], AllBlocksCleared)


def test_the_first_event_waiting_to_be_taken_calls_on_first_event_once() -> None:
    """The index publisher sleeps until this call instead of polling the pool."""
    pool = BlockPool(4)
    calls: list[int] = []
    pool.on_first_event = lambda: calls.append(len(pool._events))
    blocks = pool.get_new_blocks(2)
    assert blocks is not None and calls == []  # no eviction, no event
    cache(pool, blocks[:1], [1, 2])
    cache(pool, blocks[1:], [3, 4])
    assert calls == [1]  # the second event joined one already waiting
    assert len(pool.take_events()) == 2
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert calls == [1, 1]


def evict_order(pool: BlockPool, n: int) -> list[int]:
    """The ids of the next ``n`` blocks allocation takes, one at a time."""
    return [pool.get_new_blocks(1)[0].block_id for _ in range(n)]  # type: ignore[index]


def test_a_block_another_request_hit_outlives_blocks_freed_after_it() -> None:
    """``reuse`` eviction: a shared prefix is not pushed out by the one-off blocks of the
    requests between its uses, as it is under LRU."""
    # Never-used block 3 goes first under both; then the one-off blocks under "reuse",
    # the prefix (freed before them) under "lru".
    for policy, expected in (("reuse", [3, 2, 1]), ("lru", [3, 0, 2])):
        pool = BlockPool(4, eviction=policy)
        prefix = pool.get_new_blocks(1)
        assert prefix is not None
        cache(pool, prefix, [1, 2])
        pool.free_blocks(prefix)
        pool.touch(prefix, reuse=True)  # a later request's prefix hit
        pool.free_blocks(prefix)
        others = pool.get_new_blocks(2)  # blocks 1 and 2, then freed after the prefix
        assert others is not None
        cache(pool, others, [5, 6, 7, 8])
        pool.free_blocks(reversed(others))
        assert pool.stats().cached == 3
        assert evict_order(pool, 3) == expected, policy


def test_a_fork_sharing_its_own_blocks_is_not_reuse() -> None:
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(1)
    assert blocks is not None
    cache(pool, blocks, [1, 2])
    pool.touch(blocks)  # n > 1: a second sequence of the same request
    pool.free_blocks(blocks + blocks)
    assert not blocks[0].reused and pool.free.num_reused == 0


def test_a_block_computed_again_after_its_eviction_is_kept_as_reused() -> None:
    """A prefix used less often than the pool turns over is evicted once, then recognised
    by its hash when computed again, and kept past one-off blocks from then on."""
    pool = BlockPool(2)
    a = pool.get_new_blocks(1)
    assert a is not None
    (h,) = cache(pool, a, [1, 2])
    pool.free_blocks(a)
    pool.free_blocks(pool.get_new_blocks(2) or [])  # evicts it (block 1 first, then 0)
    assert h not in pool.cached
    again = pool.get_new_blocks(1)
    assert again is not None
    cache(pool, again, [1, 2])
    assert again[0].reused
    pool.free_blocks(again)
    one_off = pool.get_new_blocks(1)
    assert one_off is not None and one_off[0] is not again[0]
    cache(pool, one_off, [3, 4])
    pool.free_blocks(one_off)
    assert evict_order(pool, 1) == [one_off[0].block_id]
    assert h in pool.cached


def test_reset_prefix_cache_forgets_reuse() -> None:
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(1)
    assert blocks is not None
    (h,) = cache(pool, blocks, [1, 2])
    pool.free_blocks(blocks)
    pool.touch(blocks, reuse=True)
    pool.free_blocks(blocks)
    pool.get_new_blocks(2)  # evicts h: remembered as recently evicted
    pool.free_blocks(pool.blocks)
    assert pool.reset_prefix_cache()
    assert pool.free.num_reused == 0 and len(pool.free.recently_evicted) == 0
    assert not any(b.reused for b in pool.blocks)
    assert evict_order(pool, 2) == [0, 1]


def test_an_unknown_eviction_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="eviction policy"):
        BlockPool(2, eviction="mru")  # type: ignore[arg-type]
