"""A router's mirror of the prefix index against a real redis-server: it answers as Redis
does after any history, reads the index again when it missed part of the log, and steps
aside when it is not current."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import redis as sync_redis
from redis.exceptions import RedisError

from pdmesh.index import keys
from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.mirror import IndexMirror
from pdmesh.index.mirrored_index import MirroredIndex
from pdmesh.index.publisher import IndexPublisher
from pdmesh.index.update import IndexUpdate
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from pdmesh.launcher import Mesh, MeshSpec
from services.router.config import RouterConfig
from services.router.policies import build_policy
from services.router.prefill_routing import PrefillRouter

MEMBERS = [f"w{m}" for m in range(12)]


async def agree(mirror: IndexMirror, index: PrefixIndex, chains: list[list[bytes]], label: object) -> None:
    """The mirror's answer is Redis's for every chain, member by member and depth by depth."""
    for chain in chains:
        mine = {(d, m) for d, ms in mirror.holders_by_depth(chain) for m in ms}
        theirs = {(d, m) for d, ms in await index.holders_by_depth(chain) for m in ms}
        assert mine == theirs, label


async def random_history(pubs: dict[str, IndexPublisher], chains: list[list[bytes]], rng: random.Random,
                         held: dict[str, set[tuple[int, int]]]) -> None:
    """Snapshots, evictions with gaps, stores, and whole clears, as workers publish them."""
    for m, pub in pubs.items():
        roll = rng.random()
        if roll < 0.15:
            await pub.snapshot([chains[c][i] for c, i in sorted(held[m]) if rng.random() < 0.8])
            continue
        if roll < 0.25:
            await pub.apply([AllBlocksCleared()])
            continue
        gone = [(c, i) for c, i in held[m] if rng.random() < 0.15]
        back = [(c, i) for c in range(len(chains)) for i in range(len(chains[c])) if rng.random() < 0.2]
        await pub.apply([BlockRemoved(tuple(chains[c][i] for c, i in gone)),
                         BlockStored(tuple(chains[c][i] for c, i in back), None)])


def test_a_mirror_read_mid_history_answers_as_redis_after_every_change(redis_url: str) -> None:
    """Started after the index already holds blocks and followed through snapshots, clears,
    evictions that leave gaps, and many members sharing a prefix: every lookup equals the
    Lua walk's, and the mirror holds exactly Redis's blocks."""
    rng = random.Random(11)
    r = sync_redis.Redis.from_url(redis_url)
    hasher = BlockHasher(16)
    shared = [0] * 16 * 6  # a prefix every chain shares, then each its own blocks
    chains = [hasher.hash_tokens(shared + [c + 1] * 16 * 6) for c in range(4)]

    async def main() -> None:
        index = PrefixIndex(redis_url)
        pubs = {m: IndexPublisher(redis_url, m, "e1", f"x:{m}") for m in MEMBERS}
        held: dict[str, set[tuple[int, int]]] = {m: set() for m in MEMBERS}
        await random_history(pubs, chains, rng, held)
        mirror = IndexMirror(redis_url)
        await mirror.catch_up()
        assert mirror.synced and mirror.resyncs == 0
        for trial in range(25):
            await random_history(pubs, chains, rng, held)
            await mirror.catch_up()
            await agree(mirror, index, chains, trial)
            assert len(mirror) == sum(1 for _ in r.scan_iter(keys.BLOCK_KEYS, count=1000)), trial
        assert mirror.entries > 0 and mirror.resyncs == 0
        assert not mirror.tracked_by_gc()
        await mirror.close()
        await index.close()

    asyncio.run(main())


def test_a_clear_cut_into_calls_reaches_the_mirror_whole(redis_url: str) -> None:
    """A clear larger than one call is logged by each call that goes on with it; the mirror,
    reading between those calls, never shows a block Redis no longer has, and ends empty."""
    chain = BlockHasher(16).hash_tokens(list(range(16 * 40)))

    async def main() -> None:
        pub = IndexPublisher(redis_url, "big", "e1", "x:big")
        await pub.snapshot(chain)
        mirror = IndexMirror(redis_url)
        await mirror.catch_up()
        assert mirror.holders_by_depth(chain) == [(40, ["big|e1"])]
        update = IndexUpdate(pub.member)
        update.clear()
        (call,) = update.calls(batch=99, max_ops=7)
        calls = 0
        while call is not None:
            call = await pub.run_call(call)
            calls += 1
            await mirror.catch_up()
            assert mirror.holders_by_depth(chain) == []
        assert calls == 6 and len(mirror) == 0
        await mirror.close()

    asyncio.run(main())


def test_the_mirror_says_how_far_behind_the_log_it_applied_a_change(redis_url: str) -> None:
    """A change read 0.4 s after Redis logged it is 0.4 s behind; a read that finds nothing
    new puts the lag back to 0 (``pdmesh_index_mirror_lag_seconds``)."""
    chain = BlockHasher(16).hash_tokens(list(range(16 * 4)))

    async def main() -> None:
        pub = IndexPublisher(redis_url, "lag", "e1", "x:lag")
        mirror = IndexMirror(redis_url)
        await mirror.catch_up()
        await pub.snapshot(chain)
        await asyncio.sleep(0.4)
        assert await mirror.follow(None) == 1
        assert 0.35 <= mirror.lag_s < 5.0
        assert await mirror.follow(10) == 0
        assert mirror.lag_s == 0.0
        await mirror.close()

    asyncio.run(main())


def test_a_mirror_that_missed_log_entries_reads_the_index_again(redis_url: str) -> None:
    """Entries trimmed before the mirror read them (a router further behind than the log
    keeps) show as a gap in their numbers: the mirror reads the whole index again."""
    r = sync_redis.Redis.from_url(redis_url)
    chain = BlockHasher(16).hash_tokens(list(range(16 * 8)))

    async def main() -> None:
        a, b = (IndexPublisher(redis_url, w, "e1", f"x:{w}") for w in ("a", "b"))
        await a.snapshot(chain[:5])
        mirror = IndexMirror(redis_url)
        await mirror.catch_up()
        await b.snapshot(chain[:3])
        await a.apply([BlockRemoved((chain[4],))])
        r.xtrim(keys.LOG_KEY, maxlen=0)  # both entries gone unread
        await b.apply([BlockStored((chain[3],), None)])
        await mirror.catch_up()
        assert mirror.resyncs == 1
        assert {(d, m) for d, ms in mirror.holders_by_depth(chain) for m in ms} == {(4, "a|e1"), (4, "b|e1")}
        await mirror.close()

    asyncio.run(main())


def test_the_router_index_asks_redis_until_its_mirror_is_current_and_counts_both(tmp_path: Path) -> None:
    """Before its mirror has read the index the router's lookups go to Redis; once it has,
    to the mirror; with Redis gone the mirror steps aside and a lookup fails as an
    unreachable index does (the router then routes without it)."""
    mesh = Mesh(MeshSpec(model="redis-only", log_dir=str(tmp_path)))
    mesh.start_redis()
    chain = BlockHasher(16).hash_tokens(list(range(16 * 4)))

    async def main() -> None:
        await IndexPublisher(mesh.redis_url, "p", "e1", "x:p").snapshot(chain[:2])
        index = MirroredIndex(mesh.redis_url)
        router = PrefillRouter(build_policy("cache_aware", RouterConfig(model="m")), index, 16)
        assert await index.longest_prefix(chain) == {("p", "e1"): 2}
        assert index.lookups == {"redis": 1}
        assert router.health() == "ok, asking Redis until the router's mirror is current"
        task = asyncio.create_task(index.run())
        deadline = time.monotonic() + 10
        while not index.mirror.usable():
            assert time.monotonic() < deadline, "the mirror never read the index"
            await asyncio.sleep(0.01)
        assert await index.longest_prefix(chain) == {("p", "e1"): 2}
        assert index.lookups == {"redis": 1, "mirror": 1}
        assert router.health() == "ok, mirrored (2 blocks)"
        mesh.stop_redis()
        deadline = time.monotonic() + 10
        while index.mirror.usable():
            assert time.monotonic() < deadline, "the mirror kept answering without Redis"
            await asyncio.sleep(0.05)
        with pytest.raises((RedisError, OSError)):
            await index.longest_prefix(chain)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await index.close()

    try:
        asyncio.run(main())
    finally:
        mesh.stop_redis()
