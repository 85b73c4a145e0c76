"""Run a KV transfer to completion against a deadline, from asyncio.

A transfer is started on the transport and polled until DONE, FAILED or past its deadline;
the handle is released whatever happens. A failed transfer drops the peer (a dead peer's
connection is re-established from its ``Info`` on next use) and raises
``TransferFailedError``, which the RPC layer turns into ABORTED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pdmesh.errors import TransferFailedError
from pdmesh.kv.transfer.base import KVTransport, TransferState

log = logging.getLogger(__name__)
POLL_INTERVAL_S = 0.0005


class TransferRunner:
    def __init__(self, transport: KVTransport) -> None:
        self.transport = transport

    async def write(self, peer: str, src: list[int], dst: list[int], notif: bytes,
                    timeout: float) -> int:
        """Write local blocks into ``peer``'s; returns bytes moved."""
        return await self._run(peer, lambda: self.transport.write(peer, src, dst, notif),
                               len(src), timeout, "write")

    async def read(self, peer: str, local: list[int], remote: list[int], timeout: float) -> int:
        """Read ``peer``'s blocks into local blocks; returns bytes moved."""
        return await self._run(peer, lambda: self.transport.read(peer, local, remote),
                               len(local), timeout, "read")

    async def _run(self, peer: str, start: Callable[[], object], blocks: int, timeout: float,
                   what: str) -> int:
        loop = asyncio.get_running_loop()
        try:
            handle = start()
        except Exception as exc:
            self.transport.remove_peer(peer)
            raise TransferFailedError(f"KV {what} with {peer} could not start: {exc}") from exc
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    state = self.transport.poll(handle)
                except Exception as exc:
                    state = TransferState.FAILED
                    log.warning("KV %s with %s failed: %s", what, peer, exc)
                if state is TransferState.DONE:
                    return blocks * self.transport.block_bytes
                if state is TransferState.FAILED:
                    self.transport.remove_peer(peer)
                    raise TransferFailedError(f"KV {what} with {peer} failed (peer gone?)")
                if loop.time() > deadline:
                    raise TransferFailedError(
                        f"KV {what} with {peer} did not finish within {timeout:.1f}s"
                    )
                await asyncio.sleep(POLL_INTERVAL_S)
        finally:
            self.transport.release(handle)
