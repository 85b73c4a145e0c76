"""``pdmesh bench mesh``'s index section: prefix-index lookup latency with 1M blocks in a
private Redis, and router decisions per second (hash, index lookup, ``cache_aware``)."""

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
        index = PrefixIndex(mesh.redis_url, timeout=2.0)

        async def lookups() -> list[float]:
            lat = []
            for _ in range(2000 if not args.quick else 200):
                hashes = rng.choice(chains)[: rng.randrange(1, chain + 1)]
                t0 = time.perf_counter()
                await index.longest_prefix(hashes)
                lat.append(time.perf_counter() - t0)
            return lat

        lat = asyncio.run(lookups())
        rows.append(Row("index", f"lookup p50 ms ({n_blocks:,} blocks indexed, chains <= {chain})", 1000 * pct(lat, 0.5)))
        rows.append(Row("index", "lookup p99 ms", 1000 * pct(lat, 0.99)))
        rows.append(Row("router", "decisions/s (tokenize-free: hash + index + cache_aware)",
                        asyncio.run(_decisions_per_second(args, mesh.redis_url, 1000 if not args.quick else 100,
                                                          rng))))
    finally:
        mesh.stop_redis()


async def _decisions_per_second(args: argparse.Namespace, redis_url: str, n: int, rng: random.Random) -> float:
    from pdmesh.index.lookup import PrefixIndex
    from services.router.config import RouterConfig
    from services.router.core import RouterCore
    from services.router.registry import Registry

    cfg = RouterConfig(model=args.model, prefill=("a:1", "b:1"), redis_url=redis_url)
    registry = Registry(cfg)
    for i, w in enumerate(registry.workers):
        w.info = WorkerInfo(worker_id=f"prefill-{i}", epoch="e0")
        w.healthy = True
    core = RouterCore(cfg, registry, PrefixIndex(redis_url))
    from pdmesh.sampling_params import SamplingParams

    prompts = [[rng.randrange(10, 1000) for _ in range(512)] for _ in range(16)]
    params = SamplingParams()
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await core.route_prefill(prompts[i % 16], core.prompt_hashes(prompts[i % 16], params), set())

    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)
