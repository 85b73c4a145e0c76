"""The Redis prefix index against a real redis-server: publish, look up, resync."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

from pdmesh.index import keys
from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.events import AllBlocksCleared, BlockRemoved, BlockStored

CHAIN = BlockHasher(16).hash_tokens(list(range(16 * 10)))


def test_longest_prefix_per_worker_and_epoch(redis_url: str) -> None:
    async def main() -> None:
        a = IndexPublisher(redis_url, "p0", "e1", "x:1")
        b = IndexPublisher(redis_url, "p1", "e1", "x:2")
        await a.snapshot([])
        await b.snapshot([])
        await a.apply([BlockStored(tuple(CHAIN[:6]), None)])
        await b.apply([BlockStored(tuple(CHAIN[:3]), None), BlockStored((CHAIN[4],), CHAIN[3])])
        index = PrefixIndex(redis_url)
        assert await index.longest_prefix(CHAIN) == {("p0", "e1"): 6, ("p1", "e1"): 3}
        await a.apply([BlockRemoved((CHAIN[2],))])
        assert await index.longest_prefix(CHAIN) == {("p0", "e1"): 2, ("p1", "e1"): 3}
        await b.apply([AllBlocksCleared()])
        assert await index.longest_prefix(CHAIN) == {("p0", "e1"): 2}
        # A restarted worker publishes under a new epoch; its old entries stay distinguishable.
        a2 = IndexPublisher(redis_url, "p0", "e2", "x:1")
        await a2.snapshot(CHAIN[:1])
        assert await index.longest_prefix(CHAIN) == {("p0", "e1"): 2, ("p0", "e2"): 1}
        assert await index.longest_prefix([]) == {}
        await index.close()

    asyncio.run(main())


def test_snapshot_replaces_what_a_worker_published(redis_url: str) -> None:
    async def main() -> None:
        pub = IndexPublisher(redis_url, "p0", "e1", "x:1")
        await pub.snapshot(CHAIN[:5])
        await pub.snapshot(CHAIN[:2])  # after an outage: only what it holds now
        index = PrefixIndex(redis_url)
        assert await index.longest_prefix(CHAIN) == {("p0", "e1"): 2}
        published = keys.worker_blocks_key(keys.member("p0", "e1"))
        assert await index.redis.smembers(published) == {h.hex().encode() for h in CHAIN[:2]}
        await pub.apply([AllBlocksCleared()])
        assert not await index.redis.exists(published)
        assert not await index.redis.keys(keys.BLOCK_KEYS)
        await index.close()

    asyncio.run(main())


def test_members_are_read_from_their_set_and_expired_keys_leave_it(redis_url: str) -> None:
    """Routers find members through ``pdmesh:members`` (no SCAN over the index's keys);
    a record that expired is skipped and its key dropped, and renewing adds it back."""
    import redis.asyncio as aioredis

    from pdmesh.index import keys
    from pdmesh.index.membership import Member, announce, read_members

    async def main() -> None:
        client = aioredis.from_url(redis_url)
        live = Member("decode", "d0", "127.0.0.1:1", "e0")
        gone = Member("prefill", "p0", "127.0.0.1:2", "e0")
        await announce(client, keys.member_key("decode", "d0"), json.dumps(asdict(live)), 10_000)
        await announce(client, keys.member_key("prefill", "p0"), json.dumps(asdict(gone)), 50)
        await client.set(keys.member_key("prefill", "unlisted"), json.dumps(asdict(gone)))  # not announced
        assert set(await read_members(client)) == {live, gone}
        await asyncio.sleep(0.1)  # p0's record expires
        assert await read_members(client) == [live]
        assert await client.smembers(keys.MEMBERS_KEY) == {keys.member_key("decode", "d0").encode()}
        await announce(client, keys.member_key("prefill", "p0"), json.dumps(asdict(gone)), 10_000)
        assert set(await read_members(client)) == {live, gone}
        await client.aclose()

    asyncio.run(main())


def test_prefill_router_matches_holders_by_epoch_candidacy_and_recent_routes(redis_url: str) -> None:
    """What ``PrefillRouter.matched`` hands the policy: index entries only under a
    candidate's current epoch, the router's own recent routes on top, nothing for workers
    that are not candidates, and a new candidate set seen at once."""
    from pdmesh.mesh_types import WorkerInfo
    from services.router.config import RouterConfig
    from services.router.policies import build_policy
    from services.router.prefill_routing import PrefillRouter
    from services.router.worker_handle import WorkerHandle

    def handle(wid: str, epoch: str) -> WorkerHandle:
        w = WorkerHandle(f"addr-{wid}", "prefill", healthy=True)
        w.info = WorkerInfo(worker_id=wid, role="prefill", epoch=epoch)
        return w

    async def main() -> None:
        # p0 restarted too: its old epoch's longer entry must not count, whichever comes first.
        for wid, epoch, n in (("p0", "e1", 6), ("p0", "old", 9), ("p1", "old", 5), ("p2", "e1", 4),
                              ("kvstore-0", "k1", 7), ("kvstore-0", "k0", 3)):
            await IndexPublisher(redis_url, wid, epoch, f"x:{wid}").apply([BlockStored(tuple(CHAIN[:n]), None)])
        now = [0.0]
        router = PrefillRouter(build_policy("cache_aware", RouterConfig(model="m")), PrefixIndex(redis_url), 16,
                               clock=lambda: now[0])
        p0, p1, p2, p3 = handle("p0", "e1"), handle("p1", "e1"), handle("p2", "e1"), handle("p3", "e1")
        seen = await router.matched(CHAIN, [p0, p1, p3])
        # p1 restarted (its entries are of an older epoch); p2 is not a candidate.
        assert (seen.matched, seen.tier, seen.holders) == ({"p0": 6}, 7, [p0])
        # What the chosen worker is told lies beyond the candidates holding the prompt: the
        # kvstore (its longest epoch) and the members not counted as holders.
        assert seen.outside == {"kvstore-0": 7, "p1": 5, "p2": 4}
        router.recent.remember(CHAIN[:8], "p3")  # routed there, not yet indexed
        seen = await router.matched(CHAIN, [p0, p1, p3])
        assert seen.matched == {"p0": 6, "p3": 8} and set(seen.holders) == {p0, p3}
        seen = await router.matched(CHAIN, [p0, p2, p3])  # p2 became a candidate
        assert seen.matched == {"p0": 6, "p2": 4, "p3": 8} and set(seen.holders) == {p0, p2, p3}
        # A candidate known by its address until its first Info names it is found once
        # named, in the same list, within the map's refresh interval; holders come in the
        # candidates' order.
        p4 = WorkerHandle("addr-p4", "prefill", healthy=True)
        await IndexPublisher(redis_url, "p4", "e1", "x:p4").apply([BlockStored(tuple(CHAIN[:2]), None)])
        candidates = [p4, p2, p0]
        assert (await router.matched(CHAIN, candidates)).matched == {"p0": 6, "p2": 4}
        p4.info = WorkerInfo(worker_id="p4", role="prefill", epoch="e1")
        now[0] += router.by_id.refresh_s
        seen = await router.matched(CHAIN, candidates)
        assert seen.matched == {"p4": 2, "p2": 4, "p0": 6} and seen.holders == [p4, p2, p0]
        # Two handles may bear one id (a seed address that is a proxy, and the address the
        # membership gave): both hold what the id holds.
        twin = handle("p0", "e1")
        seen = await router.matched(CHAIN, [p0, p1, twin])
        assert seen.matched == {"p0": 6} and seen.holders == [p0, twin]
        # A decision records the prompt's routing key: the next one with it recurs.
        assert not router.recent.recurs(b"fresh")
        await router.choose(CHAIN, b"key", 256, [p0, p1, p3])
        assert router.recent.recurs(b"key")
        await router.index.close()

    asyncio.run(main())


def test_a_publisher_with_a_wake_event_publishes_on_it_and_otherwise_only_beats(redis_url: str) -> None:
    """An idle publisher given ``wake`` does not poll the pool every interval; an event
    recorded by the pool (which sets ``wake``) is published within moments."""
    from pdmesh.kv.block_pool import BlockPool

    async def main() -> None:
        loop, wake = asyncio.get_running_loop(), asyncio.Event()
        pool = BlockPool(8)
        pool.on_first_event = lambda: loop.call_soon_threadsafe(wake.set)
        takes = 0

        def take() -> list:  # type: ignore[type-arg]
            nonlocal takes
            takes += 1
            return pool.take_events()

        pub = IndexPublisher(redis_url, "p0", "e1", "x:1", interval=0.01)
        task = asyncio.create_task(pub.run(take, lambda: []))
        task2 = None
        try:
            await asyncio.sleep(0.3)  # without wake: a pass every 10 ms
            polling = takes
            task.cancel()
            takes = 0
            task2 = asyncio.create_task(pub.run(take, lambda: [], wake))
            await asyncio.sleep(0.3)
            idle = takes
            blocks = pool.get_new_blocks(2)
            assert blocks is not None
            pool.cache_blocks(blocks, CHAIN[:2], [list(range(16)), list(range(16, 32))], None)
            index = PrefixIndex(redis_url)
            deadline = loop.time() + 5
            while await index.longest_prefix(CHAIN) != {("p0", "e1"): 2}:
                assert loop.time() < deadline, "the woken publisher did not publish"
                await asyncio.sleep(0.005)
            await index.close()
        finally:
            for t in (task, task2):
                if t is not None:
                    t.cancel()
        assert polling >= 5, polling  # ~30 passes on an idle machine
        assert idle <= 3, idle  # the first pass, and a heartbeat's

    asyncio.run(main())


def test_longest_prefix_agrees_with_a_walk_in_python_on_random_holdings(redis_url: str) -> None:
    """Holdings with gaps (a block evicted from the middle of a worker's chain, a worker
    holding a later block but not the first) and many workers sharing a prefix, changed by
    snapshots and by events: each member's answer is the blocks before the first one it
    lacks, and each block's fingerprint is the XOR of its members' (the walk's shortcut)."""
    import random

    import redis as sync_redis

    rng = random.Random(7)
    r = sync_redis.Redis.from_url(redis_url)

    def fingerprint(members: set[str]) -> int:
        out = 0
        for m in members:
            out ^= int(keys.member_fingerprint(m), 16)
        return out

    async def main() -> None:
        index = PrefixIndex(redis_url)
        members = [f"w{m}" for m in range(12)]
        pubs = {m: IndexPublisher(redis_url, m, "e1", f"x:{m}") for m in members}
        for trial in range(30):
            chain = BlockHasher(16).hash_tokens([trial] * 16 * 12)
            held = {m: {i for i in range(12) if rng.random() < 0.9} for m in members}
            for m, blocks in held.items():
                await pubs[m].snapshot([chain[i] for i in sorted(blocks)])
            for _ in range(3):  # then events: a few blocks evicted and stored again per member
                for m, blocks in held.items():
                    gone = {i for i in blocks if rng.random() < 0.1}
                    back = {i for i in range(12) if i not in blocks and rng.random() < 0.3}
                    await pubs[m].apply([BlockRemoved(tuple(chain[i] for i in sorted(gone))),
                                         BlockStored(tuple(chain[i] for i in sorted(back)), None)])
                    held[m] = (blocks - gone) | back
                expected = {}
                for m, blocks in held.items():
                    depth = next(i for i in range(13) if i not in blocks)
                    if depth:
                        expected[(m, "e1")] = depth
                assert await index.longest_prefix(chain) == expected, trial
                for i, h in enumerate(chain):
                    holders = {keys.member(m, "e1") for m, blocks in held.items() if i in blocks}
                    stored = r.hgetall(keys.block_key(h))
                    if not holders:
                        assert not stored
                        continue
                    assert {f.decode() for f in stored} == holders | {keys.FINGERPRINT_FIELD}
                    assert int(stored[keys.FINGERPRINT_FIELD.encode()], 16) == fingerprint(holders)
        await index.close()

    asyncio.run(main())


def test_a_clear_larger_than_a_call_goes_in_several_and_leaves_nothing(redis_url: str) -> None:
    """A clear removes at most ``max_ops`` blocks per script call and is called again where
    it stopped; a block set entry whose block no longer lists the member goes too."""
    import redis as sync_redis

    from pdmesh.index.update import UPDATE, IndexUpdate, resumed

    r = sync_redis.Redis.from_url(redis_url)
    script = r.register_script(UPDATE)
    member = keys.member("p0", "e1")
    chain = BlockHasher(16).hash_tokens(list(range(16 * 25)))
    add = IndexUpdate(member)
    add.add(chain)
    for call in add.calls(batch=1):
        assert script(args=call) == 0
    r.sadd(keys.worker_blocks_key(member), "ab" * 32)  # listed, never stored
    clear = IndexUpdate(member)
    clear.clear()
    clear.add(chain[:3])
    calls = 0
    for args in clear.calls(batch=2, max_ops=4):
        call = args
        while call is not None:
            call = resumed(call, script(args=call))
            calls += 1
    assert calls == 7  # 26 listed, 4 a call
    assert {k.decode() for k in r.keys(keys.BLOCK_KEYS)} == {keys.block_key(h) for h in chain[:3]}
    assert r.smembers(keys.worker_blocks_key(member)) == {h.hex().encode() for h in chain[:3]}
    assert r.get(keys.seq_key(member)) == b"2"
