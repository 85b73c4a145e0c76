"""A simulated prefill worker: a queue served in order and an LRU pool of block hashes,
publishing what its pool gains and loses through the real ``IndexPublisher``."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pdmesh.bench.routing.traffic import Job
from pdmesh.index.publisher import IndexPublisher
from services.router.registry import WorkerHandle


@dataclass
class Served:
    job: Job
    arrival: float
    worker: int
    reason: str
    decision_s: float
    hashes: list[bytes] = field(default_factory=list, repr=False)
    work: int = 0
    """Tokens the router expected to compute (its queued-token accounting)."""
    cached: int = 0
    fetched: int = 0
    start: float = 0.0
    done: float = 0.0


class SimWorker:
    def __init__(self, index: int, pool_blocks: int, handle: WorkerHandle, publisher: IndexPublisher) -> None:
        self.index = index
        self.pool_blocks = pool_blocks
        self.handle = handle
        self.publisher = publisher
        self.lru: OrderedDict[bytes, None] = OrderedDict()
        self.queue: deque[Served] = deque()
        self.current: Served | None = None
        self.busy_s = 0.0

    def held(self, hashes: list[bytes]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self.lru:
            n += 1
        return n

    def uncached_queue(self, block_size: int) -> int:
        """Prompt tokens still to compute here, less what queued prompts will find cached
        (what a worker's ``Info`` reports)."""
        todo = 0
        if self.current is not None:
            todo += len(self.current.job.tokens) - self.current.cached - self.current.fetched
        for s in self.queue:
            todo += len(s.job.tokens) - self.held(s.hashes) * block_size
        return todo

    def store(self, hashes: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """Touch the prompt's blocks (LRU), returning (new, evicted)."""
        new = [h for h in hashes if h not in self.lru]
        for h in hashes:
            self.lru[h] = None
            self.lru.move_to_end(h)
        evicted = []
        while len(self.lru) > self.pool_blocks:
            evicted.append(self.lru.popitem(last=False)[0])
        return new, evicted
