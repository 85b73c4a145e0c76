"""The kvstore's slot bookkeeping: which block hash lives in which slot, LRU, pins.

Slots move through: free → reserved (a worker is writing it) → stored (readable, in LRU
order; a Lookup pins it for a while so a reader's READ cannot race an eviction) → free
again on eviction. Reservations that are never committed are dropped at their deadline.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdmesh.kv.block_hash import BlockHash
from pdmesh.kv.events import BlockRemoved, BlockStored, KVEvent


@dataclass
class _Reservation:
    slots: dict[BlockHash, int]
    deadline: float


@dataclass
class BlockStore:
    capacity: int
    """Slots in the pool (the byte budget divided by the block size)."""
    reservation_ttl_s: float = 30.0
    free: list[int] = field(default_factory=list)
    stored: OrderedDict[BlockHash, int] = field(default_factory=OrderedDict)
    """hash -> slot, least recently used first."""
    pinned_until: dict[int, float] = field(default_factory=dict)
    reservations: dict[str, _Reservation] = field(default_factory=dict)
    events: list[KVEvent] = field(default_factory=list)
    evictions: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"kvstore capacity must be >= 1 block, got {self.capacity}")
        self.free = list(range(self.capacity - 1, -1, -1))

    def lookup(self, hashes: Sequence[BlockHash], pin_s: float) -> list[int]:
        """Slots of the leading run of ``hashes`` held here, pinned and marked recently used."""
        until = time.monotonic() + pin_s
        slots = []
        for h in hashes:
            slot = self.stored.get(h)
            if slot is None:
                break
            self.stored.move_to_end(h)
            self.pinned_until[slot] = max(self.pinned_until.get(slot, 0.0), until)
            slots.append(slot)
        return slots

    def reserve(self, hashes: Sequence[BlockHash]) -> tuple[str, list[int]]:
        """A slot for each hash not held yet (-1 for held ones, or when nothing can be evicted)."""
        self.expire_reservations()
        rid = uuid.uuid4().hex[:12]
        pending = {h for r in self.reservations.values() for h in r.slots}
        out: list[int] = []
        taken: dict[BlockHash, int] = {}
        for h in hashes:
            if h in self.stored or h in pending or h in taken:
                out.append(-1)
                continue
            slot = self._take_slot()
            out.append(slot)
            if slot >= 0:
                taken[h] = slot
        self.reservations[rid] = _Reservation(taken, time.monotonic() + self.reservation_ttl_s)
        return rid, out

    def _take_slot(self) -> int:
        if self.free:
            return self.free.pop()
        now = time.monotonic()
        for h, slot in self.stored.items():  # oldest first
            if self.pinned_until.get(slot, 0.0) <= now:
                del self.stored[h]
                self.pinned_until.pop(slot, None)
                self.events.append(BlockRemoved((h,)))
                self.evictions += 1
                return slot
        return -1

    def commit(self, reservation_id: str, ok: bool) -> int:
        res = self.reservations.pop(reservation_id, None)
        if res is None:
            return 0
        if not ok:
            self.free.extend(res.slots.values())
            return 0
        self.stored.update(res.slots)
        if res.slots:
            self.events.append(BlockStored(tuple(res.slots), None))
        return len(res.slots)

    def expire_reservations(self) -> None:
        now = time.monotonic()
        for rid in [r for r, res in self.reservations.items() if res.deadline <= now]:
            self.commit(rid, ok=False)

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events
