"""What the router does with a decode worker's reservation besides using it: keep its
lease alive while the prefill waits, and give it back when the request will not decode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from pdmesh.rpc import messages

log = logging.getLogger(__name__)


async def keep_alive(stub: Any, request_id: str, lease_ms: int) -> None:
    """Renew every third of the lease until cancelled (or the reservation is gone): a long
    prefill queue must delay the request, not expire its reservation."""
    every = lease_ms / 3000
    while True:
        await asyncio.sleep(every)
        try:
            await stub.RenewLease(messages.renew_request(request_id, lease_ms), timeout=min(5.0, every))
        except grpc.aio.AioRpcError as exc:
            log.warning("renewing the lease of %s failed: %s", request_id, exc.code().name)
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return


async def give_back(stub: Any, request_id: str, prefill_response: Any = None) -> None:
    """Release the reservation (shielded: it must happen even when the caller is cancelled);
    ``prefill_response``: the answer of a prefill that wrote into it."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
        await asyncio.shield(stub.Release(messages.release_request(request_id, prefill_response), timeout=5.0))


_background: set[asyncio.Task[None]] = set()
"""Give-backs left to run on their own (referenced here so that they run to their end)."""


def in_background(coro: Any) -> None:
    """Run ``coro`` to its end without anyone waiting for it."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


def give_back_later(stub: Any, request_id: str, delay_s: float) -> None:
    """Give the reservation back ``delay_s`` from now, in the background; its lease, no
    longer renewed, ends it should the router stop first."""
    async def later() -> None:
        await asyncio.sleep(delay_s)
        await give_back(stub, request_id)

    in_background(later())
