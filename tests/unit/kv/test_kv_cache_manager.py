from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.block_pool import BlockPool
from pdmesh.kv.kv_cache_manager import BlockCopy, KVCacheManager
from pdmesh.request import Sequence
from pdmesh.sampling_params import SamplingParams


def seq(sid: str, tokens: list[int]) -> Sequence:
    return Sequence(sid, sid, 0, SamplingParams(), len(tokens), list(tokens), 0.0)


def run_prefill(kv: KVCacheManager, s: Sequence) -> None:
    hits = kv.get_computed_blocks(s)
    new = s.num_tokens - len(hits) * kv.block_size
    assert kv.allocate_slots(s, new, hits)
    s.num_computed_tokens = s.num_tokens
    kv.cache_blocks(s)


def test_prefix_hit_reuses_exact_blocks_and_recomputes_last_token() -> None:
    kv = KVCacheManager(BlockPool(10), BlockHasher(4))
    a = seq("a", list(range(10)))  # 2 full blocks + 2 tokens
    run_prefill(kv, a)
    assert kv.block_ids(a) == [0, 1, 2]
    kv.free(a)
    b = seq("b", list(range(8)) + [99, 98, 97])
    hits = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [0, 1]
    assert kv.allocate_slots(b, 3, hits)
    assert b.num_computed_tokens == 8 and kv.block_ids(b) == [0, 1, 3]  # never-used blocks go before freed ones
    # A prompt exactly 2 blocks long still recomputes its last block's last token.
    c = seq("c", list(range(8)))
    assert [h.block_id for h in kv.get_computed_blocks(c)] == [0]


def test_cache_salt_separates_tenants() -> None:
    kv = KVCacheManager(BlockPool(10), BlockHasher(4))
    a = seq("a", list(range(9)))
    run_prefill(kv, a)
    b = seq("b", list(range(9)))
    b.extra_keys = ("salt:other",)
    assert kv.get_computed_blocks(b) == []


def test_allocation_failure_changes_nothing() -> None:
    pool = BlockPool(3)
    kv = KVCacheManager(pool, BlockHasher(4))
    a = seq("a", list(range(13)))
    assert not kv.allocate_slots(a, 13)
    assert kv.block_ids(a) == [] and pool.stats().used == 0


def test_fork_shares_blocks_and_copies_on_write() -> None:
    pool = BlockPool(8)
    kv = KVCacheManager(pool, BlockHasher(4))
    parent = seq("p", list(range(6)))  # blocks: [0 full, 1 half]
    run_prefill(kv, parent)
    child = seq("p#1", list(range(6)))
    child.num_computed_tokens = 6
    kv.fork(parent, child)
    assert kv.block_ids(child) == [0, 1] and pool.blocks[1].ref_cnt == 2
    parent.token_ids.append(100)
    assert kv.allocate_slots(parent, 1)  # writes into shared half block 1 -> copy
    assert kv.take_copies() == [BlockCopy(src=1, dst=2)]
    assert kv.block_ids(parent) == [0, 2]
    child.token_ids.append(200)
    assert kv.allocate_slots(child, 1)  # now the only owner of block 1: no copy
    assert kv.take_copies() == [] and kv.block_ids(child) == [0, 1]
    kv.free(parent)
    kv.free(child)
    assert pool.stats().used == 0


def test_block_table_follows_every_change_of_a_sequences_blocks() -> None:
    """``block_table`` keeps each sequence's ids between steps; whatever happens to the
    blocks (appends, prefix hits, copy-on-write after a fork, a duplicate swapped for the
    cached block, trims, frees), it must equal a fresh read of them."""
    import random

    rng = random.Random(7)
    pool = BlockPool(64)
    kv = KVCacheManager(pool, BlockHasher(4))

    def fresh(s: Sequence) -> list[int]:
        return [b.block_id for b in kv._blocks.get(s.seq_id, ())]

    live: list[Sequence] = []
    prefix = list(range(8))
    for step in range(400):
        op = rng.randrange(6)
        if op == 5:  # two prompts alike computed together: the second's blocks are swapped
            twins = [seq(f"t{step}{i}", [rng.randrange(100, 200) for _ in range(9)]) for i in range(2)]
            twins[1].token_ids[:] = twins[0].token_ids
            for s in twins:
                if kv.allocate_slots(s, s.num_tokens):
                    kv.block_table(s)
                    live.append(s)
            for s in twins:
                if s in live:
                    s.num_computed_tokens = s.num_tokens
                    kv.cache_blocks(s)
        elif op == 0 or not live:  # a new prompt, often sharing a cached prefix
            s = seq(f"s{step}", (prefix if rng.random() < 0.6 else []) + [rng.randrange(100, 200) for _ in range(5)])
            hits = kv.get_computed_blocks(s)
            if kv.allocate_slots(s, s.num_tokens - len(hits) * kv.block_size, hits):
                s.num_computed_tokens = s.num_tokens
                kv.cache_blocks(s)
                live.append(s)
        elif op == 1:  # a decode step
            s = rng.choice(live)
            kv.block_table(s)  # read before it grows, as the runner does every step
            if kv.allocate_slots(s, 1):
                s.token_ids.append(rng.randrange(100, 200))
                s.num_computed_tokens = s.num_tokens
                kv.cache_blocks(s)
        elif op == 2:  # a fork whose next token copies the shared last block
            parent = rng.choice(live)
            child = seq(f"{parent.seq_id}#{step}", parent.token_ids)
            child.num_computed_tokens = parent.num_computed_tokens
            kv.block_table(child)
            kv.fork(parent, child)
            kv.block_table(child)
            if kv.allocate_slots(child, 1):
                child.token_ids.append(7)
                child.num_computed_tokens = child.num_tokens
                live.append(child)
            else:
                kv.free(child)
        elif op == 3:  # drafts rejected: trim back
            s = rng.choice(live)
            kv.block_table(s)
            if kv.allocate_slots(s, 5):
                kv.trim(s, s.num_tokens)
        else:
            s = live.pop(rng.randrange(len(live)))
            kv.free(s)
            assert kv.block_table(s) == []
        for s in live:
            assert kv.block_table(s) == fresh(s), (step, op, s.seq_id)
            assert kv.block_ids(s) == fresh(s) and kv.block_ids(s) is not kv.block_table(s)
    for s in live:
        kv.free(s)
    assert pool.stats().used == 0 and not kv._ids
