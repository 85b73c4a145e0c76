"""Time the router's prefill decision alone at N prefill workers, against a real Redis index.

    .venv/bin/python scripts/probes/routing/route_decisions.py [WORKERS] [PRELOAD_BLOCKS] [--holders=H] [--mirror] [--profile]

Starts a private redis-server, indexes PRELOAD_BLOCKS (default 200) blocks per worker plus
prefixes of 1,024 tokens, each held by H workers (default 2; 4 x WORKERS / H prefixes, at
least 4: a shared system prompt is one that every worker holds), then times 3,000
decisions of ``cache_aware`` (a held prefix + 128 new tokens: the registry's pass for the
healthy prefill workers, then ``PrefillRouter.choose``) one after another on the router's
event loop, with nothing else running in the process: what a router spends per decision,
apart from the simulator's own work (``pdmesh bench route-sim`` times decisions inside its
event loop, beside 1,000 simulated workers). Prints p50 / p90 / p99 of the decision, of
its index lookup, and Redis's own time per lookup; ``--profile`` adds cProfile's top
entries. ``--mirror``: the router reads the index from its mirror (``MirroredIndex``, the
router's default) instead of asking Redis per lookup; prints how long the mirror took to
read the index, the memory it holds (the process's resident set before and after), and
what following the log costs per operation (20,000 operations published after the
timing, then applied).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import time

from pdmesh.bench.stats import pct
from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.mirrored_index import MirroredIndex
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.events import BlockRemoved, BlockStored
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.mesh_types import WorkerInfo
from pdmesh.rpc.process import run_service_loop
from services.router.config import RouterConfig
from services.router.policies import build_policy
from services.router.prefill_routing import PrefillRouter
from services.router.worker_handle import WorkerHandle

BS = 16


def _ms(values: list[float], q: float) -> float:
    return 1000 * pct(values, q)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


async def run(url: str, workers: int, preload: int, holders: int, mirror: bool, profile: bool) -> None:
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
    prefixes = [[rng.randrange(10, 8000) for _ in range(1024)] for _ in range(max(4, 4 * workers // holders))]
    for p in prefixes:
        for i in rng.sample(range(workers), holders):
            await publisher(handles[i]).apply([BlockStored(tuple(hasher.hash_tokens(p)), None)])
    print(f"{workers} workers, {len(prefixes)} prefixes held by {holders} workers each, "
          f"{await client.dbsize()} index keys, built in {time.perf_counter() - began:.1f} s")
    index: PrefixIndex | MirroredIndex = PrefixIndex(url)
    if mirror:
        index = MirroredIndex(url)
        gc.collect()
        rss, began = _rss_mb(), time.perf_counter()
        await index.mirror.catch_up()
        print(f"the mirror read {len(index.mirror)} blocks in {time.perf_counter() - began:.1f} s, "
              f"resident set +{_rss_mb() - rss:.0f} MiB")
    router = PrefillRouter(build_policy("cache_aware", RouterConfig(model="sim")), index, BS)
    prompts = [rng.choice(prefixes) + [rng.randrange(10, 8000) for _ in range(128)] for _ in range(3000)]
    chains = [hasher.hash_tokens(p) for p in prompts]
    await client.config_resetstat()  # Redis's time per lookup: the lookups only
    gc.collect()
    gc.freeze()  # the set-up's objects are not the router's
    profiler = cProfile.Profile() if profile else None
    took, lookups = [], []
    for prompt, chain in zip(prompts, chains, strict=True):
        if profiler:
            profiler.enable()
        t = time.perf_counter()
        candidates = [w for w in handles if w.role == "prefill" and w.healthy]  # Registry.healthy's pass
        decision, _ = await router.choose(chain, chain[0], len(prompt), candidates)
        took.append(time.perf_counter() - t)
        if profiler:
            profiler.disable()
        lookups.append(router.last_lookup_s)
        decision.worker.acquire(len(prompt) - decision.cached_tokens)
    rest = [t - lookup for t, lookup in zip(took, lookups, strict=True)]
    print(f"decision p50 {_ms(took, 0.5):.3f} p90 {_ms(took, 0.9):.3f} p99 {_ms(took, 0.99):.3f} ms; "
          f"index lookup p50 {_ms(lookups, 0.5):.3f} p99 {_ms(lookups, 0.99):.3f} ms; "
          f"the rest (the router's Python) p50 {_ms(rest, 0.5):.3f} p99 {_ms(rest, 0.99):.3f} ms")
    stats = await client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    print(f"Redis's own time per lookup (INFO commandstats, evalsha): {evalsha.get('usec_per_call', 0):.0f} us mean "
          f"over {evalsha.get('calls', 0)} calls")
    if isinstance(index, MirroredIndex):
        print(f"lookups by source: {dict(index.lookups)}")
        fresh = [hasher.hash_tokens([i, 9] * (50 * BS // 2)) for i in range(200)]
        for i, chain in enumerate(fresh):  # 200 batches of 50 stores, then 200 of 50 removals
            await publisher(handles[i % workers]).apply([BlockStored(tuple(chain), None)])
        for i, chain in enumerate(fresh):
            await publisher(handles[i % workers]).apply([BlockRemoved(tuple(chain))])
        began = time.perf_counter()
        await index.mirror.catch_up()
        print(f"following the log: {1e6 * (time.perf_counter() - began) / 20_000:.2f} us per operation "
              f"(20,000 in 400 entries)")
    await client.aclose()
    await index.close()
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workers", nargs="?", type=int, default=1000)
    parser.add_argument("preload", nargs="?", type=int, default=200)
    parser.add_argument("--holders", type=int, default=2)
    parser.add_argument("--mirror", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    redis = Mesh(MeshSpec(model="sim"))
    redis.start_redis()
    try:
        # On the router's own event loop (uvloop unless PDMESH_EVENT_LOOP says otherwise).
        run_service_loop(run(redis.redis_url, args.workers, args.preload, args.holders, args.mirror, args.profile))
    finally:
        redis.stop_redis()


if __name__ == "__main__":
    main()
