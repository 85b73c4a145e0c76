"""Bounded admission: at most ``max_in_flight`` requests served at once and ``max_queued``
waiting for a slot; beyond that a request is refused at once with a retry hint
(RESOURCE_EXHAUSTED, HTTP 429) instead of piling up until something cancels it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pdmesh.errors import CapacityError


class AdmissionGate:
    def __init__(self, max_in_flight: int, max_queued: int) -> None:
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError(f"max_in_flight must be >= 1 and max_queued >= 0 "
                             f"(got {max_in_flight}, {max_queued})")
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.queued = 0
        self.refused = 0

    @contextlib.asynccontextmanager
    async def slot(self, timeout: float) -> AsyncIterator[None]:
        """Hold a slot for the body; waits at most ``timeout`` (then ``TimeoutError``)."""
        if self._slots.locked() and self.queued >= self.max_queued:
            self.refused += 1
            raise CapacityError(f"the router is at capacity ({self.in_flight} requests in flight, "
                                f"{self.queued} queued); retry in about a second")
        self.queued += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=timeout)
        finally:
            self.queued -= 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._slots.release()
