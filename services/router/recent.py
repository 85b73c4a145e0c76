"""The router's memory of where it just sent each prefix.

The Redis index learns about a prefix only after a prefill worker has computed it and
published the event, which takes a whole prefill. Requests sharing that prefix that arrive
in the meantime would look like misses and scatter across workers, each recomputing it.
So the router also remembers, for a short time, which worker it chose for every block hash
it routed, and counts those as (soon to be) cached there. It also remembers, for longer,
which routing keys (first blocks) it has routed at all: a prefix that recurs deserves a
stable home, a first sighting does not (``recurs``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from pdmesh.kv.block_hash import BlockHash


class RecentRoutes:
    def __init__(self, ttl_s: float = 30.0, max_entries: int = 200_000, max_keys: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_entries = max_entries
        self.max_keys = max_keys
        self._routes: OrderedDict[BlockHash, tuple[str, float]] = OrderedDict()
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def recurs(self, key: bytes) -> bool:
        """Whether a prompt with this routing key (its first block) came by before, the
        ``max_keys`` most recent keys remembered with no time limit; records this one. A
        key that recurs is a prefix worth a stable home even after every cache dropped it;
        a first sighting has no home to keep (``CacheAwarePolicy``)."""
        seen = key in self._keys
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return seen

    def remember(self, hashes: Sequence[BlockHash], worker_id: str) -> None:
        now = self.clock()
        for h in hashes:
            self._routes[h] = (worker_id, now)
            self._routes.move_to_end(h)
        while len(self._routes) > self.max_entries:
            self._routes.popitem(last=False)

    def depths(self, hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Leading blocks of ``hashes`` recently routed to each worker (one worker per chain)."""
        if not hashes:
            return {}
        oldest = self.clock() - self.ttl_s
        first = self._routes.get(hashes[0])
        if first is None or first[1] < oldest:
            return {}
        worker = first[0]
        depth = 0
        for h in hashes:
            entry = self._routes.get(h)
            if entry is None or entry[0] != worker or entry[1] < oldest:
                break
            depth += 1
        return {worker: depth}
