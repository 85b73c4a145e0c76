"""Token feeds, the router's end (the worker's: ``feed_source``).

The router holds one ``Feed`` stream open to each decode worker it uses; a ``Decode`` or
``GenerateLocal`` call that names it gets its messages over the feed, batched per engine
step, while the call itself carries the request's deadline, cancellation and final
status. Until a worker's feed is open (its first, empty batch arrived) requests to it
stream on their own calls, as they do when the router runs with ``token_feed`` off.

Order and failure: a request's messages arrive in order on the feed; its call may end
before its last message arrives (two streams), so the relay waits for the message that
carries the finish reason while the feed keeps delivering, and ``FEED_LAG_S`` once it goes
silent. (A fixed wait after the call's end failed requests under overload: the worker queues
a step's messages for the feed and ends the call at once, so with the router reading slowly
the feed ran seconds behind the calls' ends, every request past the wait failed as a broken
stream, and the only decode worker was marked down.) A feed that breaks fails every request
using it with the feed's status (UNAVAILABLE when the worker died), which the flow treats
as it treats a broken decode stream: the request continues on another worker from the
tokens the caller has (messages of the old worker that arrive later are dropped).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from pdmesh.rpc.clients import decode_stub
from pdmesh.rpc.process import cancel_all
from pdmesh.rpc.status import InferredUnavailable
from pdmesh.v1 import worker_pb2

log = logging.getLogger(__name__)
FEED_LAG_S = 5.0
"""How long a feed may deliver nothing while a request whose call ended waits on it for its
final message, before the request counts its stream as broken."""
REOPEN_AFTER_S = 1.0
"""A worker whose feed failed is asked again no sooner than this."""
_ENDED = object()
"""Queued when a fed call ended with OK: its final message is on the feed."""


def unavailable(details: str) -> InferredUnavailable:
    """A status the flow handles as a broken decode stream (continue elsewhere)."""
    return InferredUnavailable(details)


class WorkerFeed:
    """One decode worker's feed: the stream, and the requests waiting for messages on it."""

    def __init__(self, address: str, feed_id: str) -> None:
        self.address = address
        self.feed_id = feed_id
        self.open = False
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._tried_at = -REOPEN_AFTER_S
        self.batch_at = 0.0
        """Loop time the last batch arrived: a feed behind its calls' ends still delivers."""

    def subscribe(self, request_id: str) -> asyncio.Queue[Any] | None:
        """The queue ``request_id``'s messages will arrive on; None while the feed is not
        open (the request streams on its own call; the feed is opened for the next ones)."""
        if not self.open:
            self._ensure_reader()
            return None
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = queue
        return queue

    def unsubscribe(self, request_id: str, queue: asyncio.Queue[Any]) -> None:
        if self._queues.get(request_id) is queue:
            del self._queues[request_id]

    def _ensure_reader(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._task is None and now - self._tried_at >= REOPEN_AFTER_S:
            self._tried_at = now
            self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        call = decode_stub(self.address).Feed(worker_pb2.FeedRequest(feed_id=self.feed_id))
        error: BaseException = unavailable(f"the token feed from {self.address} ended")
        try:
            async for batch in call:
                self.open = True
                self.batch_at = asyncio.get_running_loop().time()
                queues = self._queues
                for resp in batch.responses:
                    queue = queues.get(resp.request_id)
                    if queue is not None:  # else: a request that left (finished, moved, aborted)
                        queue.put_nowait(resp)
        except grpc.aio.AioRpcError as exc:
            error = exc
            if self.open:
                log.warning("token feed from %s broke: %s %s", self.address, exc.code().name, exc.details())
        finally:
            call.cancel()
            self.open = False
            self._task = None
            queues, self._queues = self._queues, {}
            for queue in queues.values():
                queue.put_nowait(error)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])


class Feeds:
    """This router's feeds, one per decode worker address, under one feed id."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.feed_id = f"router-{uuid.uuid4().hex}"
        self._workers: dict[str, WorkerFeed] = {}
        self.fed = 0
        """Decode calls whose messages came over a feed (the others: on the call itself)."""
        self.unfed = 0

    def is_open(self, address: str) -> bool:
        feed = self._workers.get(address)
        return feed is not None and feed.open

    def start(self, address: str, method: str, msg: Any, metadata: Any, timeout: float) -> Any:
        """Start ``method`` (``Decode`` or ``GenerateLocal``) on the decode worker at
        ``address``: a ``FedCall`` when its feed is open, else the plain call."""
        rpc = getattr(decode_stub(address), method)
        if not self.enabled:
            self.unfed += 1
            return rpc(msg, metadata=metadata, timeout=timeout)
        feed = self._workers.get(address)
        if feed is None:
            feed = self._workers[address] = WorkerFeed(address, self.feed_id)
        queue = feed.subscribe(msg.request_id)
        if queue is None:
            self.unfed += 1
            return rpc(msg, metadata=metadata, timeout=timeout)
        self.fed += 1
        msg.feed_id = self.feed_id
        call = rpc(msg, metadata=metadata, timeout=timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        return FedCall(call, feed, msg.request_id, queue, min(FEED_LAG_S, timeout), deadline)

    async def close(self) -> None:
        for feed in list(self._workers.values()):
            await feed.close()


class FedCall:
    """A decode call whose messages come over a feed, iterated and cancelled like the call.

    Iterating yields the call's messages until the one with the finish reason: from the
    feed, or from the call itself when the worker did not hold the feed; the call's failure
    (or the feed's) is raised, and leaving unsubscribes from the feed."""

    def __init__(self, call: Any, feed: WorkerFeed, request_id: str, queue: asyncio.Queue[Any],
                 lag_s: float, deadline: float = float("inf")) -> None:
        self.call, self.feed, self.request_id, self.queue, self.lag_s = call, feed, request_id, queue, lag_s
        self.deadline = deadline
        """Loop time the request's own deadline passes: no wait on the feed outlives it."""

    def cancel(self) -> bool:
        return bool(self.call.cancel())

    async def __aiter__(self) -> AsyncIterator[Any]:
        queue = self.queue
        watcher = asyncio.ensure_future(self._watch())
        ended = False
        try:
            while True:
                if not ended:
                    item = await queue.get()
                else:
                    item = await self._trailing()
                if item is _ENDED:
                    ended = True
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason:
                    return
        finally:
            watcher.cancel()
            self.feed.unsubscribe(self.request_id, queue)

    async def _trailing(self) -> Any:
        """The next message after the call ended: waited for while the feed delivers, as a
        feed that runs behind still brings it, and given up ``lag_s`` after its last batch or
        at the request's deadline."""
        loop = asyncio.get_running_loop()
        while True:
            silent = loop.time() - self.feed.batch_at
            try:
                wait = min(self.lag_s - silent, self.deadline - loop.time())
                return await asyncio.wait_for(self.queue.get(), max(0.0, wait))
            except TimeoutError:
                if loop.time() >= self.deadline:
                    raise unavailable("the decode call ended but its last message had not come on the token "
                                      "feed by the request's deadline") from None
                if loop.time() - self.feed.batch_at >= self.lag_s:
                    raise unavailable(f"the decode call ended but its last message did not come: the token "
                                      f"feed delivered nothing for {self.lag_s:.1f} s") from None

    async def _watch(self) -> None:
        """The call's own messages (a worker that did not hold the feed), then its end."""
        try:
            async for resp in self.call:
                self.queue.put_nowait(resp)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            self.queue.put_nowait(exc)
            return
        self.queue.put_nowait(_ENDED)
