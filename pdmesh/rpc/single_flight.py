"""One call in flight per key; concurrent callers share its outcome.

Connecting NIXL to a peer is check-then-act across an ``await``: two requests that both
found no connection both fetched the peer's ``Info`` and both registered it, and the
second registration invalidated the first request's transfer already under way
(``remote agent ... was invalidated or re-registered during transfer``; a request failed
and its decode worker was marked down). Every caller here waits on the one call with its
own deadline, and a caller that gives up does not cancel it for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Future[T]] = {}

    async def run(self, key: str, call: Callable[[], Awaitable[T]], timeout: float) -> T:
        """``call()``'s result, started only if no call for ``key`` is in flight. ``call``
        must bound itself; ``timeout`` bounds this caller's wait for a call someone else
        started (asyncio.TimeoutError past it)."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(call())
            self._flights[key] = flight
            flight.add_done_callback(lambda f: self._landed(key, f))
        return await asyncio.wait_for(asyncio.shield(flight), timeout)

    def busy(self, key: str) -> bool:
        """A call for ``key`` is in flight (``run`` would join it)."""
        return key in self._flights

    def _landed(self, key: str, flight: asyncio.Future[T]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: every waiter may have given up already
