"""Whether a reservation awaiting its KV needs this worker's progress passes.

UCX moves some writes only while the target polls (over TCP each part waits for a pass
here), others entirely within the writer's own call (over shared memory UCX's ``cma``
copies as the write is posted). A decode worker awaiting KV polled every 2 ms for the
whole prefill either way: on a 2-core machine ~50 passes of ~60 us per lone 256-token
prompt, each taking a core from that very prefill's two OpenMP threads (its forward 2.5-3
ms slower; docs/performance/log.md §31). The prefill worker knows which kind its writes were
(DONE at the first poll, right after the call) and says so; the router passes it on with
``Decode`` (or ``Release``, when the first token ended the request). While the writes
lately have all landed inline, and none has not for ``TRUST_S``, awaiting KV needs no
passes (the idle rate goes on: a write that lapsed must still complete); one write that
did not puts the passes back at once. Over shared memory nearly all do: a peer's first
write (UCX connects then) and an odd one later do not, hence a short ``TRUST_S``. Over TCP
none does, so the passes never stop; a mesh whose decode worker takes writes both ways
keeps them while the others come every few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

TRUST_S = 5.0
"""How long after a ``Decode`` whose KV did not land inline (or whose writer did not
say) every awaited reservation gets passes again."""
INLINE_RUN = 4
"""Inline writes in a row before the passes stop."""


class WritePath:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._inline_run = 0
        self._polled_at = float("-inf")

    def saw(self, inline: bool) -> None:
        """A prompt's KV landed; ``inline``: all its writes within their writer's calls."""
        if inline:
            self._inline_run += 1
        else:
            self._inline_run = 0
            self._polled_at = self.clock()

    def needs_passes(self) -> bool:
        """Read from the transfer poller's thread (two plain reads)."""
        return self._inline_run < INLINE_RUN or self.clock() - self._polled_at < TRUST_S
