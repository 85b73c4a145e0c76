"""Token feeds, the worker's end: one stream per router carrying every step's messages.

Without a feed each request's tokens leave on the request's own ``Decode`` stream: one
gRPC message per token per request, written by this worker's event loop while the engine
thread waits for the GIL to start its next step (docs/performance/log.md §17: 64 requests
on one worker, the gap between two decode steps 6.4-7.3 ms p50, 2.7-4.9 ms with a feed).
With a feed the messages of one step go out as one ``FeedBatch``, and the per-request
call only carries the request's lifecycle: its deadline, its cancellation, its status.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pdmesh.v1 import generate_pb2, worker_pb2

MAX_BATCH = 512
"""Messages per FeedBatch: a step of a very large batch is split, far below gRPC's limit."""


class FeedQueue:
    """The messages waiting to go to one router, and the stream that sends them."""

    def __init__(self) -> None:
        self._pending: list[generate_pb2.GenerateResponse] = []
        self._ready = asyncio.Event()
        self.closed = False

    def push(self, resp: generate_pb2.GenerateResponse) -> None:
        if self.closed:
            return
        self._pending.append(resp)
        self._ready.set()

    def close(self) -> None:
        """End the stream (replaced by a newer feed of the same router); pushes are dropped
        from now on, and the router fails over the requests that were using it."""
        self.closed = True
        self._ready.set()

    async def batches(self) -> AsyncIterator[worker_pb2.FeedBatch]:
        yield worker_pb2.FeedBatch()  # open: the router may name this feed from now on
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.closed:
                return
            pending, self._pending = self._pending, []
            for i in range(0, len(pending), MAX_BATCH):
                yield worker_pb2.FeedBatch(responses=pending[i:i + MAX_BATCH])


class Feeds:
    """The feeds routers hold open on this worker, by feed id."""

    def __init__(self) -> None:
        self._feeds: dict[str, FeedQueue] = {}

    def get(self, feed_id: str) -> FeedQueue | None:
        """The open feed ``feed_id`` names (None: not open here, or no id)."""
        return self._feeds.get(feed_id) if feed_id else None

    async def serve(self, feed_id: str) -> AsyncIterator[worker_pb2.FeedBatch]:
        """The ``Feed`` RPC: open ``feed_id`` (replacing an older one), stream its batches."""
        old = self._feeds.get(feed_id)
        if old is not None:
            old.close()
        feed = self._feeds[feed_id] = FeedQueue()
        try:
            async for batch in feed.batches():
                yield batch
        finally:
            feed.closed = True
            if self._feeds.get(feed_id) is feed:
                del self._feeds[feed_id]
