"""Writes on a server call that a cancel of their writer does not leave half done.

A server handler's ``context.write`` starts a gRPC batch that completes only once the
message is on its way, which waits for the client's flow-control window: a client that
is slow to read holds it. Cancelling the task that awaits it does not stop the batch, and
any operation on the call started meanwhile fails with ``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``
(``context.abort`` included), after which the call neither answers nor ends. The prefill
worker's ``PrefillStream`` met this when the router's stop (its caller had left right
after the first token) cancelled the work while that token's write was in flight: the
router waited its 5 s for the worker to stop and left the reservation to its lease.

So each write runs in its own task, after the one before it, and whoever ends the call
waits for the last one first (``settled``). A write ends when the client reads, or fails
when the call is cancelled or its deadline passes; ``settled`` waits no longer than the
call's deadline, or ``NO_DEADLINE_WAIT_S`` for a call without one.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc

from pdmesh.rpc.process import remaining

NO_DEADLINE_WAIT_S = 30.0
"""How long ``settled`` waits on a call whose client set no deadline."""


class CallWrites:
    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._last: asyncio.Future[None] | None = None
        """The latest write (each waits for the one before it)."""

    async def write(self, msg: Any) -> None:
        """Write ``msg`` after the writes before it. A cancelled caller returns at once; the
        write goes on (``settled`` waits for it)."""
        self._last = asyncio.ensure_future(self._after(self._last, msg))
        self._last.add_done_callback(_seen)  # its writer may be gone: not an unretrieved error
        await asyncio.shield(self._last)

    async def _after(self, before: asyncio.Future[None] | None, msg: Any) -> None:
        if before is not None:
            await before  # one that failed fails this one too: the call is broken
        await self._context.write(msg)

    async def settled(self) -> None:
        """Wait until no write is in flight on the call, whatever became of them (a failed
        one was raised to its writer already, or the call is ending anyway). Past the
        call's deadline it returns anyway: ending the call may then fail, which the
        client, gone or out of time, no longer waits for."""
        if self._last is not None:
            await within_call(self._context, self._last)


async def within_call(context: grpc.aio.ServicerContext, done: asyncio.Future[Any]) -> None:
    """Wait for ``done`` however it ends, no longer than the call's deadline
    (``NO_DEADLINE_WAIT_S`` for a call without one), and without cancelling it: what a
    handler awaits before it ends its call, so that the end does not cross it."""
    if not done.done():
        with contextlib.suppress(Exception):
            async with asyncio.timeout(remaining(context, NO_DEADLINE_WAIT_S)):
                await asyncio.shield(done)


def _seen(write: asyncio.Future[None]) -> None:
    if not write.cancelled():
        write.exception()
