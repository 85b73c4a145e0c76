"""The router's end of one ``PrefillStream`` call: stopped, never cancelled, once its
destination is on its way.

Once the prefill worker has a reservation's blocks as its destination it may be writing
into them, and a reservation given back while a write is in flight could be handed to
another request before that write lands there. Only the prefill worker knows when its
writes stopped, so the router asks it (``stop_message``) and gives the reservation back
once the call ended (``stopped``); the worker ends it only when no write is in flight.

gRPC cancels a call whose read or write is interrupted by the caller's own cancel (a
client that left), so every read and the destination's write run in their own tasks,
awaited through ``asyncio.shield``: the call outlives the cancel of whoever waits on it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from pdmesh.rpc import messages
from pdmesh.rpc.status import WORKER_FAILED


async def send(call: Any, msg: Any, last: bool = False) -> None:
    """Write ``msg`` on a client-streaming ``call`` (and half-close it when ``last``). A call
    that already ended refuses the write; awaiting the call raises its status, which says
    why, so the refusal itself is not raised here."""
    try:
        await call.write(msg)
        if last:
            await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        pass


class PrefillCall:
    def __init__(self, call: Any, rid: str) -> None:
        self.call = call
        self.rid = rid
        self._destination: asyncio.Future[None] | None = None
        """The destination's write, once started."""
        self._stop: asyncio.Future[None] | None = None
        self._reading: asyncio.Future[Any] | None = None
        self._abandoned = False
        """Cancelled here: its end says nothing about the worker's writes."""
        self._answered = False
        """The worker's whole answer came, which it sends only once every KV write of the
        call is done: no write can be in flight, whatever status the call ends with."""

    @property
    def destined(self) -> bool:
        """The destination was (or is being) written: the worker may write KV from now on."""
        return self._destination is not None

    async def request(self, msg: Any) -> None:
        await send(self.call, msg)

    async def destination(self, handle: Any) -> None:
        self._destination = asyncio.ensure_future(send(self.call, messages.destination_message(self.rid, handle)))
        await asyncio.shield(self._destination)

    async def read(self) -> Any:
        """The call's next message (``grpc.aio.EOF`` at its end; its status raised when it
        failed). A cancelled reader leaves the read running for the next one."""
        if self._reading is None:
            self._reading = asyncio.ensure_future(self.call.read())
            self._reading.add_done_callback(self._saw)
        reading = self._reading
        try:
            return await asyncio.shield(reading)
        finally:
            if reading.done():
                self._reading = None

    def cancel(self) -> bool:
        """What ``RequestFlow.abort`` reaches: a cancel before the destination, a stop after
        (none once the whole answer came: the worker ends the call itself)."""
        if not self.destined:
            return self.abandon()
        if not self._answered:
            self._ask_stop()
        return True

    def abandon(self) -> bool:
        """Cancel the call outright: for when no write can follow, or waiting for the
        worker to stop took too long."""
        self._abandoned = self._abandoned or not self.call.done()
        if self._reading is not None:  # a read left by a cancelled reader ends with the call: seen here
            self._reading.add_done_callback(_seen)
        return self.call.cancel()

    def close(self) -> None:
        """End the call, unless a stop is under way: whoever waits for it (``stopped``) ends
        it, when the worker has stopped or the wait is over, and a cancel now would cut
        that wait short."""
        if self._stop is None or self.call.done():
            self.abandon()

    @property
    def stop_sent(self) -> bool:
        """A stop was asked of the worker on this call."""
        return self._stop is not None

    def _ask_stop(self) -> None:
        if self._stop is None:
            self._stop = asyncio.ensure_future(self._send_stop())

    async def _send_stop(self) -> None:
        if self._destination is not None:
            await self._destination  # one write at a time: the stop follows the destination
        await send(self.call, messages.stop_message(self.rid), last=True)

    async def stopped(self, wait_s: float) -> bool:
        """True once no write of this call can still be in flight: the destination never
        went, or the worker ended the call (asked to stop first when it still runs).
        False when it did not end within ``wait_s``: the call is then cancelled, and the
        reservation is best left to its lease. Once the whole answer came no write can
        be in flight, and no stop is sent: it would only cross the call's end (``cut_off``)."""
        if not self.destined:
            self.abandon()
            return True
        if self._answered:
            return True
        if self.call.done():
            return not self._abandoned
        self._ask_stop()
        try:
            async with asyncio.timeout(wait_s):
                while await self.read() is not grpc.aio.EOF:
                    pass  # an answer that crossed the stop on its way
        except TimeoutError:
            self.abandon()
            return False
        except grpc.aio.AioRpcError:  # its end (CANCELLED when it stopped)
            pass
        except asyncio.CancelledError:
            if not self.call.done():  # whoever waits here was cancelled: the call still runs
                raise
        return not self._abandoned

    def _saw(self, read: asyncio.Future[Any]) -> None:
        if read.cancelled() or read.exception() is not None:
            return
        msg = read.result()
        if msg is not grpc.aio.EOF and not msg.first_only:
            self._answered = True

    async def cut_off(self) -> bool:
        """The call ended, once the destination went, in a way its connection may have
        caused (``WORKER_FAILED``) rather than the worker's answer or its stop. A worker that
        lives sees the same break as its call cancelled and stops as if asked, but a write
        in flight still lands, and the router cannot see when. A call whose whole answer
        came was not cut off, whatever its status: a stop that crossed that answer on its
        way fails to be written on the stream the worker closed, and grpcio then reports
        the call INTERNAL, "Internal error from Core", over the worker's OK
        (grpc/grpc#36066). Before, that gave the reservation back 5 s late, 5 times in six
        runs of the 100 requests of tests/integration/mesh/test_cancellations.py."""
        if not self.destined or self._abandoned or self._answered or not self.call.done():
            return False
        code = await self.call.code()
        if code == grpc.StatusCode.CANCELLED and self._stop is not None:
            return False  # how the worker answers the stop
        return code in WORKER_FAILED


def _seen(read: asyncio.Future[Any]) -> None:
    if not read.cancelled():
        read.exception()
