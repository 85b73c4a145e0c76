"""How often the kvstore drives its UCX progress: fast only while a peer's transfer may be
waiting for it.

The store is a transfer target: prefill workers READ pinned slots after a ``Lookup`` and
WRITE reserved ones after a ``Reserve``. Over shared memory (UCX's ``cma``) neither needs a
pass here; over TCP each part waits for one. With no NIXL progress thread (it spins a
core), the store's event loop polls. It used to poll every 2 ms even with nothing in
flight, 7% of a core on a 2-core machine, whose every wake-up preempts a thread of a
worker's OpenMP team in the middle of a forward pass (docs/performance/log.md §27); the
workers' own pollers had been slowed down for that reason (``pdmesh/kv/transfer/poller.py``).
Now it polls at the workers' await rate (2 ms, as before when idle) while an offload's
reservation is open and for ``READ_WINDOW_S`` after a lookup that pinned slots (the
fetch's READ follows at once), at their idle rate otherwise (writes whose reservation
lapsed must still complete); before, it polled every 0.5 ms while a reservation was open.
A lookup or a reservation wakes the pump at once, so the idle rate delays nothing that
was announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from pdmesh.kv.transfer.poller import AWAIT_INTERVAL_S, IDLE_INTERVAL_S
from services.kvstore.store import BlockStore

if TYPE_CHECKING:
    from services.kvstore.pool import StorePool

READ_WINDOW_S = 0.5
"""How long after a lookup that pinned slots the await rate holds: its reader READs them
next. A READ still running after that goes on at the idle rate."""


class ProgressPace:
    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.reads_until = 0.0
        """``time.monotonic()`` until which READs are expected."""

    def reads_expected(self) -> None:
        """A lookup pinned slots: its reader READs them next."""
        self.reads_until = time.monotonic() + READ_WINDOW_S
        self.wake.set()

    def writes_expected(self) -> None:
        """A reservation was handed out: its writer WRITEs next."""
        self.wake.set()

    def interval(self, store: BlockStore) -> float:
        """Seconds to the next pass, unless a lookup or reservation wakes it sooner."""
        if store.reservations:
            store.expire_reservations()  # a writer that died must not keep the pace up
        if store.reservations or time.monotonic() < self.reads_until:
            return AWAIT_INTERVAL_S
        return IDLE_INTERVAL_S


async def progress_pump(pool: StorePool, pace: ProgressPace) -> None:
    """Drive the store's UCX progress at ``pace`` for as long as the process serves."""
    while True:
        pool.transport.progress()
        pace.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pace.wake.wait(), pace.interval(pool.store))
