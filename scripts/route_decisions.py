"""Time the router's prefill decision alone at N prefill workers, against a real Redis index.

    .venv/bin/python scripts/route_decisions.py [WORKERS] [PRELOAD_BLOCKS] [--profile]

Starts a private redis-server, indexes PRELOAD_BLOCKS (default 200) blocks per worker plus
2 x WORKERS prefixes of 1,024 tokens, each held by two workers, then times 3,000
``PrefillRouter.choose`` calls of ``cache_aware`` (a held prefix + 128 new tokens) one
after another, with nothing else running in the process: what a router spends per
decision, apart from the simulator's own work (``pdmesh bench route-sim`` times decisions
inside its event loop, beside 1,000 simulated workers). Prints p50 / p90 / p99 of the
decision and of its index lookup; ``--profile`` adds cProfile's top entries.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import pstats
import random
import sys
import time

from pdmesh.bench.stats import pct
from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.events import BlockStored
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.mesh_types import WorkerInfo
from services.router.config import RouterConfig
from services.router.policies import build_policy
from services.router.prefill_routing import PrefillRouter
from services.router.registry import WorkerHandle

BS = 16


def _ms(values: list[float], q: float) -> float:
    return 1000 * pct(values, q)


async def run(url: str, workers: int, preload: int, profile: bool) -> None:
    import redis.asyncio as aioredis

    rng = random.Random(0)
    hasher = BlockHasher(BS)
    client = aioredis.from_url(url)
    handles = []
    for i in range(workers):
        w = WorkerHandle(f"sim:{i}", "prefill", healthy=True)
        w.info = WorkerInfo(worker_id=f"prefill-{i}", role="prefill", epoch="e0",
                            prefill_us_per_token=700, kvstore_us_per_token=70)
        handles.append(w)

    def publisher(w: WorkerHandle) -> IndexPublisher:
        return IndexPublisher(url, w.worker_id, "e0", w.address, client=client)

    began = time.perf_counter()
    for i, w in enumerate(handles):  # other tenants' blocks: the index at scale
        await publisher(w).apply([BlockStored(tuple(hasher.hash_tokens([i, 7] * (preload * BS // 2))), None)])
    prefixes = [[rng.randrange(10, 8000) for _ in range(1024)] for _ in range(2 * workers)]
    for p in prefixes:
        for i in rng.sample(range(workers), 2):
            await publisher(handles[i]).apply([BlockStored(tuple(hasher.hash_tokens(p)), None)])
    print(f"{workers} workers, {await client.dbsize()} index keys, built in {time.perf_counter() - began:.1f} s")
    await client.aclose()
    router = PrefillRouter(build_policy("cache_aware", RouterConfig(model="sim")), PrefixIndex(url), BS)
    prompts = [rng.choice(prefixes) + [rng.randrange(10, 8000) for _ in range(128)] for _ in range(3000)]
    chains = [hasher.hash_tokens(p) for p in prompts]
    gc.collect()
    gc.freeze()  # the set-up's objects are not the router's
    profiler = cProfile.Profile() if profile else None
    took, lookups = [], []
    for prompt, chain in zip(prompts, chains, strict=True):
        candidates = [w for w in handles if w.healthy]  # as Registry.healthy() gives them
        if profiler:
            profiler.enable()
        t = time.perf_counter()
        decision, _ = await router.choose(chain, chain[0], len(prompt), candidates)
        took.append(time.perf_counter() - t)
        if profiler:
            profiler.disable()
        lookups.append(router.last_lookup_s)
        decision.worker.acquire(len(prompt) - decision.cached_tokens)
    await router.index.close()
    rest = [t - lookup for t, lookup in zip(took, lookups, strict=True)]
    print(f"decision p50 {_ms(took, 0.5):.3f} p90 {_ms(took, 0.9):.3f} p99 {_ms(took, 0.99):.3f} ms; "
          f"index lookup p50 {_ms(lookups, 0.5):.3f} p99 {_ms(lookups, 0.99):.3f} ms; "
          f"the rest (the router's Python) p50 {_ms(rest, 0.5):.3f} p99 {_ms(rest, 0.99):.3f} ms")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    workers = int(args[0]) if args else 1000
    preload = int(args[1]) if len(args) > 1 else 200
    redis = Mesh(MeshSpec(model="sim"))
    redis.start_redis()
    try:
        asyncio.run(run(redis.redis_url, workers, preload, "--profile" in sys.argv))
    finally:
        redis.stop_redis()


if __name__ == "__main__":
    main()
