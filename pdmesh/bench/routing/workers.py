"""A simulated prefill worker: a queue served in order and a pool of block hashes, evicted
as the engine's are, that publishes what it gains and loses through the real ``IndexPublisher``."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pdmesh.bench.routing.traffic import Job
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.events import BlockRemoved, BlockStored, KVEvent
from pdmesh.kv.eviction import EvictionPolicy, RecentlyEvicted
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.request import Sequence
from pdmesh.sampling_params import SamplingParams
from services.router.registry import WorkerHandle


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
    hashes: list[bytes] = field(default_factory=list, repr=False)
    work: int = 0
    """Tokens the router expected to compute (its queued-token accounting)."""
    cached: int = 0
    fetched: int = 0
    start: float = 0.0
    done: float = 0.0


def through_engine_cache(kv: KVCacheManager, request_id: str, tokens: list[int]) -> int:
    """One prompt through the engine's own ``KVCacheManager`` with nothing else in flight,
    as a prefill takes it: its cached prefix held, blocks allocated for the rest, all
    registered once computed, then freed tail first; returns the blocks found cached. What
    ``SimPool.store`` models, and what ``scripts/prefix_eviction_model.py`` replays."""
    seq = Sequence(request_id, request_id, 0, SamplingParams(), len(tokens), list(tokens), 0.0)
    hits = kv.get_computed_blocks(seq)
    if not kv.allocate_slots(seq, len(tokens) - len(hits) * kv.block_size, hits):
        raise ValueError(f"{kv.pool.num_blocks} blocks cannot hold a {len(tokens)}-token prompt")
    seq.num_computed_tokens = len(tokens)
    kv.cache_blocks(seq)
    kv.free(seq)
    return len(hits)


class SimPool:
    """A pool of block hashes that evicts as the engine's ``BlockPool`` does under
    ``policy`` (``pdmesh/kv/eviction.py``) and publishes what it gains and loses to the
    index: a worker's prefix cache, or (``lru``) the kvstore tier."""

    def __init__(self, capacity: int, publisher: IndexPublisher, policy: EvictionPolicy = "reuse") -> None:
        self.capacity = capacity
        self.publisher = publisher
        self.policy = policy
        self.once: OrderedDict[bytes, None] = OrderedDict()
        self.reused: OrderedDict[bytes, None] = OrderedDict()
        """Blocks a later request hit, or computed again after eviction: evicted after
        every block in ``once``, least recently used first within each."""
        self.recently_evicted = RecentlyEvicted(capacity if policy == "reuse" else 0)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.once or block_hash in self.reused

    def __len__(self) -> int:
        return len(self.once) + len(self.reused)

    def held(self, hashes: list[bytes], start: int = 0) -> int:
        """Leading blocks of ``hashes[start:]`` present."""
        n = start
        while n < len(hashes) and hashes[n] in self:
            n += 1
        return n - start

    async def store(self, hashes: list[bytes]) -> None:
        """A request's blocks, once it is served, in the engine's order: its leading hits
        are held, blocks for the rest are taken (evicting from the head of ``once``, then of
        ``reused``), and all are freed tail first, so a chain loses its last blocks before
        the one all others follow (``KVCacheManager``). Publishes what was gained and lost."""
        hits = set(hashes[: self.held(hashes)])
        for h in hits:
            (self.reused if h in self.reused else self.once).pop(h)
        evicted = []
        while self and len(self) + len(hashes) > self.capacity:
            h = (self.once if self.once else self.reused).popitem(last=False)[0]
            self.recently_evicted.add(h)
            evicted.append(h)
        new = [h for h in hashes[len(hits):] if h not in self]  # hits are out of the pool now
        again = {h for h in new if self.recently_evicted.take(h)}
        for h in reversed(hashes):
            if h in hits:
                (self.reused if self.policy == "reuse" else self.once)[h] = None
            elif h in again:
                self.reused[h] = None
            elif h in self.once or h in self.reused:
                continue  # a block past the first miss that is cached already: the entry stays
            else:
                self.once[h] = None
        events: list[KVEvent] = ([BlockRemoved(tuple(evicted))] if evicted else []) + (
            [BlockStored(tuple(new), None)] if new else [])
        if events:
            await self.publisher.apply(events)


class SimWorker:
    def __init__(self, index: int, pool_blocks: int, handle: WorkerHandle, publisher: IndexPublisher) -> None:
        self.index = index
        self.handle = handle
        self.pool = SimPool(pool_blocks, publisher)
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
