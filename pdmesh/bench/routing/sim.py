"""A discrete-event model of N prefill workers, routed by the router's real code.

What is real: the policy (``build_policy``), the prefill decision (``PrefillRouter``: index
lookup, epochs, recent routes), the ``WorkerHandle`` load and queued-token figures, and the
index protocol (``IndexPublisher`` events into a real Redis, and lookups from the router's
mirror of it, ``MirroredIndex``, or from Redis itself with ``index="redis"``). What is
modelled: each worker serves its queue in order, a request costing
``overhead_s + computed * s_per_token + fetched * s_per_token * fetch_ratio`` (costs
measured on the real engine, ``costs.py``), and holds a prefix cache of ``pool_blocks``
blocks that is the engine's own ``KVCacheManager`` and ``BlockPool`` (``EnginePool``); a
shared kvstore tier of ``kvstore_blocks`` (LRU, as the kvstore) is optional. Workers report
their queue to the router every ``info_interval_s`` like ``Info`` does, and publish a
prompt's blocks when its prefill starts (a real worker publishes them chunk by chunk while
it computes).
Time is virtual, so 1,000 workers run on a laptop; decision latency is wall-clock. The
mirror catches up with the index's log before each decision, outside its timing (a
router's mirror trails the log by milliseconds, which virtual time cannot model); the
time that takes is reported apart (``mirror_s``): it is the router's cost of following
the index.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass, replace

import redis.asyncio as aioredis

from pdmesh.bench.routing.traffic import Job, Traffic
from pdmesh.bench.routing.workers import LRUBlocks, Served, SimWorker
from pdmesh.index import keys
from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.mirrored_index import MirroredIndex
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.events import BlockStored
from pdmesh.mesh_types import WorkerInfo
from pdmesh.rpc.process import run_service_loop
from services.router.config import RouterConfig
from services.router.policies import build_policy
from services.router.prefill_routing import PrefillRouter
from services.router.worker_handle import WorkerHandle


@dataclass(frozen=True)
class SimSpec:
    prefill_workers: int = 32
    pool_blocks: int = 0
    """Blocks each worker's pool holds (0: ``pool_factor`` x the traffic's distinct blocks
    / workers, so one pool holds a fraction of them and all pools together hold them)."""
    pool_factor: float = 1.5
    block_size: int = 16
    s_per_token: float = 100e-6
    overhead_s: float = 0.005
    """Per request (scheduling, hand-off), measured with ``s_per_token``."""
    fetch_ratio: float = 0.1
    route_tolerance: float = RouterConfig.route_tolerance
    """cache_aware's ``route_tolerance``."""
    kvstore_blocks: int = 0
    load: float = 0.7
    """Arrival rate as a fraction of capacity: the request rate the workers sustain when
    they compute only the oracle's tokens."""
    info_interval_s: float = 0.5
    think_s: float = 2.0
    """Mean pause between a conversation's turns (exponential), after its answer."""
    tpot_s: float = 0.03
    """Decode time per output token (when a conversation's next turn can start)."""
    slo_s: float = 1.0
    """TTFT objective for goodput."""
    preload_blocks: int = 0
    """Blocks each worker publishes before the run (other tenants' cache), to measure the
    index at scale: 1,000 workers x 1,100 = 1.1M indexed blocks."""
    seed: int = 0
    index: str = "mirror"
    """Where decisions read the index: "mirror" (the router's default) or "redis"."""


@dataclass
class SimResult:
    policy: str
    workers: int
    load: float
    served: list[Served]
    worker_busy_s: list[float]
    duration_s: float
    oracle_computed: int
    prompt_tokens: int
    decisions: Counter[str]
    redis_ops_per_s: float
    redis_memory_mb: float
    indexed_blocks: int
    wall_s: float
    pool_blocks: int
    mirror_s: float = 0.0
    """Wall seconds the router's mirror spent following the index's log."""


class Simulation:
    def __init__(self, policy: str, traffic: Traffic, spec: SimSpec, redis_url: str) -> None:
        self.policy_name = policy
        self.traffic = traffic
        self.spec = spec
        self.redis_url = redis_url
        self.now = 0.0
        self.rng = random.Random(spec.seed)
        self.hasher = BlockHasher(spec.block_size)
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        unique = traffic.unique_blocks(spec.block_size)
        self.pool_blocks = spec.pool_blocks or max(
            1 + max(len(j.tokens) for j in traffic.jobs) // spec.block_size,
            int(spec.pool_factor * unique / spec.prefill_workers))
        self.oracle = traffic.oracle_computed(spec.block_size)
        mean_service = spec.overhead_s + self.oracle / len(traffic.jobs) * spec.s_per_token
        self.rate = spec.load * spec.prefill_workers / mean_service
        """Requests per second, every turn counted."""

    # -- events -----------------------------------------------------------------------
    def _at(self, t: float, kind: str, item: object) -> None:
        heapq.heappush(self._events, (t, next(self._order), kind, item))

    async def run(self) -> SimResult:
        spec = self.spec
        client = aioredis.from_url(self.redis_url)
        await client.flushdb()
        self.client = client
        self.index = MirroredIndex(self.redis_url) if spec.index == "mirror" else PrefixIndex(self.redis_url)
        self.mirror_s = 0.0
        cfg = RouterConfig(model="sim", prefill_us_per_token=spec.s_per_token * 1e6,
                           kvstore_cost_ratio=spec.fetch_ratio, route_tolerance=spec.route_tolerance)
        self.router = PrefillRouter(build_policy(self.policy_name, cfg), self.index, spec.block_size,
                                    clock=lambda: self.now)
        self.workers = [self._worker(i, client) for i in range(spec.prefill_workers)]
        self.store = LRUBlocks(spec.kvstore_blocks, IndexPublisher(
            self.redis_url, "kvstore-0", "e0", "sim", client=client)) if spec.kvstore_blocks else None
        if spec.preload_blocks:
            await self._preload()
        await self.index.catch_up()  # a router starting: its mirror reads the index once
        ops_before = await self._redis_ops()
        wall = time.perf_counter()
        starts_rate = self.rate * len(self.traffic.starts) / len(self.traffic.jobs)
        t = 0.0
        for job in self.traffic.starts:
            t += self.rng.expovariate(starts_rate)
            self._at(t, "arrive", job)
        self._at(spec.info_interval_s, "info", None)
        self.served: list[Served] = []
        self.decisions: Counter[str] = Counter()
        pending = len(self.traffic.jobs)
        while pending:
            self.now, _, kind, item = heapq.heappop(self._events)
            if kind == "arrive":
                await self._arrive(item)  # type: ignore[arg-type]
            elif kind == "done":
                pending -= 1
                await self._done(item)  # type: ignore[arg-type]
            elif kind == "info":
                self._report()
                self._at(self.now + spec.info_interval_s, "info", None)
        wall = time.perf_counter() - wall
        ops = (await self._redis_ops() - ops_before) / wall
        memory = (await client.info("memory"))["used_memory"] / 2**20
        indexed = await client.eval("return #redis.call('KEYS', ARGV[1])", 0, keys.BLOCK_KEYS)
        await client.aclose()
        await self.index.close()
        return SimResult(self.policy_name, spec.prefill_workers, spec.load, self.served,
                         [w.busy_s for w in self.workers], self.now, self.oracle,
                         self.traffic.prompt_tokens, self.decisions, ops, memory, int(indexed), wall,
                         self.pool_blocks, self.mirror_s)

    def _worker(self, i: int, client: aioredis.Redis) -> SimWorker:
        handle = WorkerHandle(f"sim:{i}", "prefill", healthy=True)
        handle.info = WorkerInfo(worker_id=f"prefill-{i}", role="prefill", epoch="e0",
                                 prefill_us_per_token=self.spec.s_per_token * 1e6,
                                 kvstore_us_per_token=self.spec.s_per_token * self.spec.fetch_ratio * 1e6)
        publisher = IndexPublisher(self.redis_url, handle.worker_id, "e0", handle.address, client=client)
        return SimWorker(i, self.pool_blocks, handle, publisher, self.hasher)

    async def _preload(self) -> None:
        for w in self.workers:
            chain = self.hasher.hash_tokens([w.index, 7] * (self.spec.preload_blocks * self.spec.block_size // 2))
            await w.pool.publisher.apply([BlockStored(tuple(chain), None)])

    async def _redis_ops(self) -> int:
        return int((await self.client.info("stats"))["total_commands_processed"])

    def _report(self) -> None:
        """What each worker's ``Info`` would say now."""
        for w in self.workers:
            info = w.handle.info
            assert info is not None
            w.handle.info = replace(info, queued_prefill_tokens=w.uncached_queue(self.spec.block_size),
                                    num_waiting=len(w.queue))
            w.handle.info_at = self.now

    # -- one request --------------------------------------------------------------------
    async def _arrive(self, job: Job) -> None:
        hashes = self.hasher.hash_tokens(job.tokens)
        candidates = [w.handle for w in self.workers]
        began = time.perf_counter()
        await self.index.catch_up()
        self.mirror_s += time.perf_counter() - began
        began = time.perf_counter()
        decision, _ = await self.router.choose(hashes, hashes[0] if hashes else b"", len(job.tokens), candidates)
        took = time.perf_counter() - began
        self.decisions[decision.reason] += 1
        worker = self.workers[int(decision.worker.address.split(":")[1])]
        served = Served(job, self.now, worker.index, decision.reason, took, self.router.last_lookup_s,
                        self.router.last_members, hashes, work=max(0, len(job.tokens) - decision.cached_tokens))
        decision.worker.acquire(served.work, now=self.now)
        worker.queue.append(served)
        if worker.current is None:
            await self._start_next(worker)

    async def _start_next(self, w: SimWorker) -> None:
        if not w.queue:
            w.current = None
            return
        s = w.current = w.queue.popleft()
        spec = self.spec
        held = await w.pool.serve(str(s.job.index), s.job.tokens)
        s.cached = held * spec.block_size
        s.fetched = (self.store.held(s.hashes, held) if self.store else 0) * spec.block_size
        computed = len(s.job.tokens) - s.cached - s.fetched
        service = spec.overhead_s + computed * spec.s_per_token + s.fetched * spec.s_per_token * spec.fetch_ratio
        s.start = self.now
        w.busy_s += service
        self._at(self.now + service, "done", s)

    async def _done(self, s: Served) -> None:
        s.done = self.now
        self.served.append(s)
        w = self.workers[s.worker]
        w.handle.release(s.work, now=self.now)
        if self.store is not None:
            await self.store.store(s.hashes)
        nxt = s.job.next_turn
        if nxt is not None:
            pause = s.job.output_len * self.spec.tpot_s + self.rng.expovariate(1 / self.spec.think_s)
            self._at(self.now + pause, "arrive", nxt)
        await self._start_next(w)


def simulate(policy: str, traffic: Traffic, spec: SimSpec, redis_url: str) -> SimResult:
    # On the router's own event loop (uvloop unless PDMESH_EVENT_LOOP says otherwise):
    # the decisions' latency is the router's.
    return run_service_loop(Simulation(policy, traffic, spec, redis_url).run())
