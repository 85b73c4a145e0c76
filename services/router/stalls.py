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

import time
from collections import deque
from dataclasses import dataclass, field

GAPS_KEPT = 256
"""Recent gaps per worker that its bound is taken from."""


@dataclass
class StallWatch:
    """One decode worker's recent gaps and when it last stalled (``WorkerHandle.stalls``)."""

    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))
    stalled_at: float = float("-inf")
    """Monotonic time of its last stall; -inf: none since it last delivered."""

    def delivered(self, gap_s: float | None) -> None:
        """A stream of it sent a message, ``gap_s`` after the one before (None: its first)."""
        if gap_s is not None:
            self.gaps.append(gap_s)
        self.stalled_at = float("-inf")

    def bound(self, floor_s: float, ceiling_s: float, factor: float) -> float:
        """How long a stream of this worker may wait for its next message."""
        if not self.gaps:
            return floor_s
        ordered = sorted(self.gaps)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return min(ceiling_s, max(floor_s, factor * p99))

    def stalled(self) -> None:
        self.stalled_at = time.monotonic()

    def holding(self, hold_s: float) -> bool:
        """It stalled within the last ``hold_s`` and has not delivered since."""
        return time.monotonic() - self.stalled_at < hold_s
