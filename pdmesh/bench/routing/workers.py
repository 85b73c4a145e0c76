"""A simulated prefill worker: a queue served in order and the engine's own prefix cache,
which publishes what it gains and loses through the real ``IndexPublisher``; and the
kvstore tier, an LRU pool of block hashes."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pdmesh.bench.routing.traffic import Job
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.block_hash import BlockHash, BlockHasher
from pdmesh.kv.block_pool import BlockPool
from pdmesh.kv.events import BlockRemoved, BlockStored, KVEvent
from pdmesh.kv.eviction import EvictionPolicy
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.request import Sequence
from pdmesh.sampling_params import SamplingParams
from services.router.worker_handle import WorkerHandle


@dataclass
class Served:
    job: Job
    arrival: float
    worker: int
    reason: str
    decision_s: float
    lookup_s: float
    """Of ``decision_s``, the index lookup (a Redis round trip)."""
    members: int = 0
    """Index members the lookup named (a popular prefix: many workers)."""
    hashes: list[BlockHash] = field(default_factory=list, repr=False)
    work: int = 0
    """Tokens the router expected to compute (its queued-token accounting)."""
    cached: int = 0
    fetched: int = 0
    start: float = 0.0
    done: float = 0.0


def through_engine_cache(kv: KVCacheManager, request_id: str, tokens: list[int]) -> int:
    """One prompt through the engine's own ``KVCacheManager`` with nothing else in flight,
    as a prefill takes it: its cached prefix held, blocks allocated for the rest, all
    registered once computed, then freed tail first; returns the blocks found cached. How
    the routing simulator's prefill workers serve (``EnginePool``), and what
    ``scripts/probes/routing/prefix_eviction_model.py`` replays."""
    seq = Sequence(request_id, request_id, 0, SamplingParams(), len(tokens), list(tokens), 0.0)
    hits = kv.get_computed_blocks(seq)
    if not kv.allocate_slots(seq, len(tokens) - len(hits) * kv.block_size, hits):
        raise ValueError(f"{kv.pool.num_blocks} blocks cannot hold a {len(tokens)}-token prompt")
    seq.num_computed_tokens = len(tokens)
    kv.cache_blocks(seq)
    kv.free(seq)
    return len(hits)


class EnginePool:
    """A simulated prefill worker's prefix cache: the engine's own ``KVCacheManager`` over
    a ``BlockPool`` (its eviction order included, ``pdmesh/kv/eviction.py``), each served
    prompt run through it as a prefill takes it (``through_engine_cache``), and the pool's
    own events published to the index, so the simulator has no model of the cache to keep
    in step with the engine's."""

    def __init__(self, capacity: int, publisher: IndexPublisher, hasher: BlockHasher,
                 policy: EvictionPolicy = "reuse") -> None:
        self.kv = KVCacheManager(BlockPool(capacity, eviction=policy), hasher)
        self.publisher = publisher

    def held(self, hashes: list[BlockHash]) -> int:
        """Leading blocks of ``hashes`` in the prefix cache."""
        cached, n = self.kv.pool.cached, 0
        while n < len(hashes) and hashes[n] in cached:
            n += 1
        return n

    async def serve(self, request_id: str, tokens: list[int]) -> int:
        """One prompt prefilled here; returns the blocks it found cached."""
        hits = through_engine_cache(self.kv, request_id, tokens)
        events = self.kv.pool.take_events()
        if events:
            await self.publisher.apply(events)
        return hits


class LRUBlocks:
    """The kvstore tier: block hashes evicted least recently used first, publishing what
    it gains and loses to the index."""

    def __init__(self, capacity: int, publisher: IndexPublisher) -> None:
        self.capacity = capacity
        self.publisher = publisher
        self.blocks: OrderedDict[BlockHash, None] = OrderedDict()

    def held(self, hashes: list[BlockHash], start: int = 0) -> int:
        """Leading blocks of ``hashes[start:]`` present."""
        n = start
        while n < len(hashes) and hashes[n] in self.blocks:
            n += 1
        return n - start

    async def store(self, hashes: list[BlockHash]) -> None:
        """Touch the blocks, evict beyond capacity, publish both. A prompt's tail is touched
        first, so it is evicted before its head: a chain loses its last blocks, not the one
        all others follow."""
        new = [h for h in hashes if h not in self.blocks]
        for h in reversed(hashes):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        evicted: list[BlockHash] = []
        while len(self.blocks) > self.capacity:
            evicted.append(self.blocks.popitem(last=False)[0])
        events: list[KVEvent] = []
        if evicted:
            events.append(BlockRemoved(tuple(evicted)))
        if new:
            events.append(BlockStored(tuple(new), None))
        if events:
            await self.publisher.apply(events)


class SimWorker:
    def __init__(self, index: int, pool_blocks: int, handle: WorkerHandle, publisher: IndexPublisher,
                 hasher: BlockHasher) -> None:
        self.index = index
        self.handle = handle
        self.pool = EnginePool(pool_blocks, publisher, hasher)
        self.queue: deque[Served] = deque()
        self.current: Served | None = None
        self.busy_s = 0.0

    def uncached_queue(self, block_size: int) -> int:
        """Prompt tokens still to compute here, less what queued prompts will find cached
        (what a worker's ``Info`` reports)."""
        todo = 0
        if self.current is not None:
            todo += len(self.current.job.tokens) - self.current.cached - self.current.fetched
        for s in self.queue:
            todo += len(s.job.tokens) - self.pool.held(s.hashes) * block_size
        return todo
