"""A decode worker that stops producing tokens while its process still answers (an engine
stuck in a kernel, a step that never ends): seen from the gaps between its messages.

A stopped process is found by its connection's pings (``MESH_CHANNEL_OPTIONS``); a live
process whose engine is stuck still answers pings and ``Info``, so only its streams show
it. Each decode worker's recent gaps between two messages of one stream (after the
stream's first: before it, a stream waits for its KV or its own prefill) set how long a
stream waits for its next message: ``factor`` times their 99th percentile, within
``[floor_s, ceiling_s]``. A stream that waits longer is moved to another decode worker
(the migration path of a worker that died: the same tokens), and its worker gets no new
request for ``hold_s`` unless one of its streams delivers again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pdmesh.rpc.status import InferredUnavailable

GAPS_KEPT = 256
"""Recent gaps per worker that its bound is taken from."""
REORDER_EVERY = 32
"""New gaps between two computations of a worker's 99th percentile (not one sort per token)."""


@dataclass
class StallWatch:
    """One decode worker's recent gaps and when it last stalled (``WorkerHandle.stalls``)."""

    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))
    stalled_at: float = float("-inf")
    """Monotonic time of its last stall; -inf: none since it last delivered."""
    p99: float = 0.0
    """The gaps' 99th percentile, as of ``unsorted`` gaps ago."""
    unsorted: int = 0

    def delivered(self, gap_s: float | None) -> None:
        """A stream of it sent a message, ``gap_s`` after the one before (None: its first)."""
        if gap_s is not None:
            self.gaps.append(gap_s)
            self.unsorted += 1
            if self.unsorted >= REORDER_EVERY or len(self.gaps) <= REORDER_EVERY:
                ordered = sorted(self.gaps)
                self.p99, self.unsorted = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 0
        self.stalled_at = float("-inf")

    def bound(self, floor_s: float, ceiling_s: float, factor: float) -> float:
        """How long a stream of this worker may wait for its next message."""
        return min(ceiling_s, max(floor_s, factor * self.p99))

    def stalled(self) -> None:
        self.stalled_at = time.monotonic()

    def holding(self, hold_s: float) -> bool:
        """It stalled within the last ``hold_s`` and has not delivered since."""
        return time.monotonic() - self.stalled_at < hold_s


async def watched(call: Any, watch: StallWatch, bound: Callable[[], float | None], worker_id: str
                  ) -> AsyncIterator[Any]:
    """``call``'s messages, each after the first within ``bound()`` (None: no bound), the
    gaps recorded in ``watch``; a message later than that raises ``stalled``. Read in the
    caller's task: a timeout cancels the read, and with it the call, which the caller then
    leaves."""
    messages = call.__aiter__()
    last: float | None = None  # when the previous message came; None before the first
    while True:
        limit = None if last is None else bound()
        waiting = asyncio.timeout(limit)
        try:
            async with waiting:
                resp = await anext(messages)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if not waiting.expired():
                raise  # the call's own, not the bound's
            watch.stalled()
            raise stalled(worker_id, limit or 0.0) from None
        now = asyncio.get_running_loop().time()
        watch.delivered(None if last is None else now - last)
        last = now
        yield resp


def stalled(worker_id: str, bound_s: float) -> InferredUnavailable:
    """A stream that went without a message past its bound, as the failed call it is to
    the migration path (UNAVAILABLE: ``flow.MIGRATE_ON``); its worker is held off new
    requests (``StallWatch.holding``), not marked down."""
    return InferredUnavailable(f"decode worker {worker_id} sent no token for {bound_s:.1f}s (stalled)")
