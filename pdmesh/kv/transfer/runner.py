"""Run a KV transfer to completion against a deadline, from asyncio.

A transfer is started on the transport and watched by the ``TransferPoller``'s thread
until DONE or FAILED; the coroutine waits for that result up to its deadline. The handle is
released whatever happens. A failed transfer drops the peer (a dead peer's connection is
re-established from its ``Info`` on next use) and raises ``TransferFailedError``, which the
RPC layer turns into ABORTED.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdmesh.errors import TransferFailedError
from pdmesh.kv.transfer.base import KVTransport, TransferState
from pdmesh.kv.transfer.poller import TransferPoller


@dataclass(frozen=True, slots=True)
class Moved:
    bytes: int
    seconds: float
    """From the start of the transfer to the poller seeing it done: the transfer's own
    time, without the event loop's delay in resuming the waiter."""


class TransferRunner:
    def __init__(self, transport: KVTransport) -> None:
        self.transport = transport
        self.poller = TransferPoller(transport)

    async def write(self, peer: str, src: list[int], dst: list[int], notif: bytes,
                    timeout: float) -> Moved:
        """Write local blocks into ``peer``'s."""
        return await self._run(peer, lambda: self.transport.write(peer, src, dst, notif),
                               len(src), timeout, "write")

    async def read(self, peer: str, local: list[int], remote: list[int], timeout: float) -> Moved:
        """Read ``peer``'s blocks into local blocks."""
        return await self._run(peer, lambda: self.transport.read(peer, local, remote),
                               len(local), timeout, "read")

    async def _run(self, peer: str, start: Callable[[], object], blocks: int, timeout: float,
                   what: str) -> Moved:
        started = time.perf_counter()
        try:
            handle = start()
        except Exception as exc:
            self.transport.remove_peer(peer)
            raise TransferFailedError(f"KV {what} with {peer} could not start: {exc}") from exc
        try:
            try:
                state, done_at = await asyncio.wait_for(self.poller.watch(handle, f"{what} with {peer}"),
                                                        timeout)
            except TimeoutError:
                raise TransferFailedError(
                    f"KV {what} with {peer} did not finish within {timeout:.1f}s"
                ) from None
            if state is TransferState.FAILED:
                self.transport.remove_peer(peer)
                raise TransferFailedError(f"KV {what} with {peer} failed (peer gone?)")
            return Moved(blocks * self.transport.block_bytes, done_at - started)
        finally:
            self.poller.forget(handle)
            self.transport.release(handle)
