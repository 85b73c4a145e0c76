"""``pdmesh bench mesh``'s index section: prefix-index lookup latency with 1M blocks in a
private Redis, asked per lookup and read from the router's mirror of it, and router
decisions per second (hash, index lookup, ``cache_aware``) each way."""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from pdmesh.bench.report_row import Row
from pdmesh.bench.stats import pct
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.mesh_types import WorkerInfo


def bench_index(args: argparse.Namespace, rows: list[Row], rng: random.Random) -> None:
    import redis

    from pdmesh.index import keys
    from pdmesh.index.lookup import PrefixIndex
    from pdmesh.index.mirrored_index import MirroredIndex
    from pdmesh.index.update import UPDATE, IndexUpdate
    from pdmesh.kv.block_hash import BlockHasher

    n_blocks = 20_000 if args.quick else 1_000_000
    chain = 64
    mesh = Mesh(MeshSpec(model=args.model))
    mesh.start_redis()
    try:
        r = redis.Redis(port=mesh.redis_port)
        hasher = BlockHasher(16)
        chains = []
        updates = [IndexUpdate(keys.member(f"prefill-{w}", "e0")) for w in range(4)]
        for c in range(n_blocks // chain):
            hashes = hasher.hash_tokens([c] * 16 + list(range(16 * chain - 16)))
            chains.append(hashes)
            updates[c % 4].add(hashes)
        script = r.register_script(UPDATE)
        for update in updates:
            for call in update.calls(batch=1):
                assert script(args=call) == 0  # additions only: never stops early

        async def lookups(index: PrefixIndex | MirroredIndex) -> list[float]:
            await index.catch_up()
            lat = []
            for _ in range(2000 if not args.quick else 200):
                hashes = rng.choice(chains)[: rng.randrange(1, chain + 1)]
                t0 = time.perf_counter()
                await index.longest_prefix(hashes)
                lat.append(time.perf_counter() - t0)
            await index.close()
            return lat

        for source, mirror in (("Redis", False), ("the router's mirror", True)):
            index = MirroredIndex(mesh.redis_url) if mirror else PrefixIndex(mesh.redis_url, timeout=2.0)
            lat = asyncio.run(lookups(index))
            rows.append(Row("index", f"lookup p50 ms from {source} ({n_blocks:,} blocks indexed, chains <= {chain})",
                            1000 * pct(lat, 0.5)))
            rows.append(Row("index", f"lookup p99 ms from {source}", 1000 * pct(lat, 0.99)))
            rows.append(Row("router", f"decisions/s from {source} (tokenize-free: hash + index + cache_aware)",
                            asyncio.run(_decisions_per_second(args, mesh.redis_url, 1000 if not args.quick else 100,
                                                              rng, mirror))))
    finally:
        mesh.stop_redis()


async def _decisions_per_second(args: argparse.Namespace, redis_url: str, n: int, rng: random.Random,
                                mirror: bool) -> float:
    from pdmesh.index.lookup import PrefixIndex
    from pdmesh.index.mirrored_index import MirroredIndex
    from services.router.config import RouterConfig
    from services.router.registry import Registry
    from services.router.router import Router

    cfg = RouterConfig(model=args.model, prefill=("a:1", "b:1"), redis_url=redis_url)
    registry = Registry(cfg)
    for i, w in enumerate(registry.workers):
        w.info = WorkerInfo(worker_id=f"prefill-{i}", epoch="e0")
        w.healthy = True
    index = MirroredIndex(redis_url) if mirror else PrefixIndex(redis_url)
    await index.catch_up()
    router = Router(cfg, registry, index)
    from pdmesh.sampling_params import SamplingParams

    prompts = [[rng.randrange(10, 1000) for _ in range(512)] for _ in range(16)]
    params = SamplingParams()
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await router.route_prefill(prompts[i % 16], router.prompt_hashes(prompts[i % 16], params), set())

    await asyncio.gather(*(one(i) for i in range(n)))
    took = time.perf_counter() - t0
    await index.close()
    return n / took
