"""A simulated prefill worker: a queue served in order and an LRU pool of block hashes
that publishes what it gains and loses through the real ``IndexPublisher``."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pdmesh.bench.routing.traffic import Job
from pdmesh.index.publisher import IndexPublisher
from pdmesh.kv.events import BlockRemoved, BlockStored, KVEvent
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
    hashes: list[bytes] = field(default_factory=list, repr=False)
    work: int = 0
    """Tokens the router expected to compute (its queued-token accounting)."""
    cached: int = 0
    fetched: int = 0
    start: float = 0.0
    done: float = 0.0


class LRUBlocks:
    """A pool of block hashes evicted least recently used first, publishing what it gains
    and loses to the index: a worker's prefix cache, or the kvstore tier."""

    def __init__(self, capacity: int, publisher: IndexPublisher) -> None:
        self.capacity = capacity
        self.publisher = publisher
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def held(self, hashes: list[bytes], start: int = 0) -> int:
        """Leading blocks of ``hashes[start:]`` present."""
        n = start
        while n < len(hashes) and hashes[n] in self.blocks:
            n += 1
        return n - start

    async def store(self, hashes: list[bytes]) -> None:
        """Touch the blocks, evict beyond capacity, publish both. A prompt's tail is touched
        first, so it is evicted before its head, as the engine frees a request's blocks
        (``KVCacheManager``): a chain loses its last blocks, not the one all others follow."""
        new = [h for h in hashes if h not in self.blocks]
        for h in reversed(hashes):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        evicted = []
        while len(self.blocks) > self.capacity:
            evicted.append(self.blocks.popitem(last=False)[0])
        events: list[KVEvent] = ([BlockRemoved(tuple(evicted))] if evicted else []) + (
            [BlockStored(tuple(new), None)] if new else [])
        if events:
            await self.publisher.apply(events)


class SimWorker:
    def __init__(self, index: int, pool_blocks: int, handle: WorkerHandle, publisher: IndexPublisher) -> None:
        self.index = index
        self.handle = handle
        self.pool = LRUBlocks(pool_blocks, publisher)
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
