"""Run a KV transfer to completion against a deadline, from asyncio.

A transfer is started on the transport and watched by the ``TransferPoller``'s thread
until DONE or FAILED; the coroutine waits for that result up to its deadline. The handle
is released whatever happens. A waiter cancelled while its transfer is in flight still
waits for it (up to the same deadline) before the cancel goes on: once posted, a write
lands whether anyone waits or not, and whoever learns from this call's end that no write
is in flight (the router, before it frees the target blocks) must not learn it early. A
failed transfer raises ``TransferFailedError``, which the RPC layer turns into ABORTED,
and drops the peer (a restarted peer's connection is re-established from its ``Info`` on
next use) once no other transfer with it is in flight: dropped at once, one failed write
failed every write in flight to a live peer (NIXL_ERR_NOT_FOUND when they were polled
next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdmesh.errors import TransferFailedError
from pdmesh.kv.transfer.base import KVTransport, TransferState
from pdmesh.kv.transfer.copy_priority import CopyPriority, copy_priority
from pdmesh.kv.transfer.poller import TransferPoller, poll_state

log = logging.getLogger(__name__)


class BusyClock:
    """Seconds during which at least one transfer of a kind was in flight.

    A burst's writes overlap (the event loop posts one request's write while the poller
    still waits on the last), so the sum of each write's own time counts the same seconds
    several times over: KV throughput is bytes over these seconds. Ends may be reported
    out of order (each write's end is when the poller saw it, its waiter resumes later).
    """

    def __init__(self) -> None:
        self._open = 0
        self._since = 0.0
        self._last_end = 0.0
        self._total = 0.0

    def start(self, now: float) -> None:
        if self._open == 0:
            self._since = self._last_end = now
        self._open += 1

    def stop(self, end: float) -> None:
        self._open -= 1
        self._last_end = max(self._last_end, end)
        if self._open == 0:
            self._total += self._last_end - self._since

    @property
    def seconds(self) -> float:
        """Closed busy periods only (an open one is counted when it closes)."""
        return self._total


@dataclass(frozen=True, slots=True)
class Moved:
    bytes: int
    seconds: float
    """From the start of the transfer to the poller seeing it done: the transfer's own
    time, without the event loop's delay in resuming the waiter."""
    inline: bool = False
    """DONE at the first poll, right after the call that started it: the data moved
    within that call (shared memory), with no progress pass needed at the peer."""


class TransferRunner:
    def __init__(self, transport: KVTransport, priority: CopyPriority | None = None) -> None:
        """``priority``: what a transfer's start and first poll run at on the thread that
        starts it (between processes on one host the start copies the data itself;
        ``copy_priority.py``); None: that thread's own."""
        self.transport = transport
        self.priority = priority or copy_priority("normal")
        self.poller = TransferPoller(transport)
        self.writing = BusyClock()
        self._in_flight: dict[str, int] = {}
        """Transfers started with each peer and not yet released."""
        self._stale: set[str] = set()
        """Peers a transfer failed with since the last that succeeded: dropped when idle."""

    async def write(self, peer: str, src: list[int], dst: list[int], timeout: float,
                    landed: Callable[[int], None] | None = None) -> Moved:
        """Write local blocks into ``peer``'s. Done means the data is in the peer's memory
        (NIXL reports a transfer DONE once its writes are complete at the target), so
        an RPC sent after it may tell the peer the blocks are there. ``landed``: told the
        bytes once they are there, also when the waiter was cancelled meanwhile."""
        return await self._run(peer, lambda: self.transport.write(peer, src, dst),
                               len(src), timeout, "write", self.writing, landed)

    async def read(self, peer: str, local: list[int], remote: list[int], timeout: float) -> Moved:
        """Read ``peer``'s blocks into local blocks."""
        return await self._run(peer, lambda: self.transport.read(peer, local, remote),
                               len(local), timeout, "read")

    def _begin(self, start: Callable[[], object], what: str) -> tuple[object, TransferState, float]:
        """Start a transfer and poll it once, at ``priority``. Polled here first: over
        shared memory a write is usually DONE already (UCX's ``cma`` copies within the
        call), and the poller thread would add its wait for a core and the GIL on a busy
        worker (under load 2-7 ms p50-p90 for 4 MiB writes started in 0.6 ms;
        docs/performance/log.md section 15). Returns when that poll saw the state."""
        handle = start()
        return handle, poll_state(self.transport, handle, what), time.perf_counter()

    async def _run(self, peer: str, start: Callable[[], object], blocks: int, timeout: float,
                   what: str, clock: BusyClock | None = None,
                   landed: Callable[[int], None] | None = None) -> Moved:
        started = time.perf_counter()
        nbytes = blocks * self.transport.block_bytes
        try:
            handle, state, polled_at = self.priority.call(self._begin, start, f"{what} with {peer}")
        except Exception as exc:
            self._failed(peer)
            raise TransferFailedError(f"KV {what} with {peer} could not start: {exc}") from exc
        done_at = 0.0
        failed: bool | None = None  # None: a deadline or a cancelled waiter, which says
        # nothing about the peer's connection
        self._in_flight[peer] = self._in_flight.get(peer, 0) + 1
        if clock is not None:
            clock.start(started)
        try:
            if state is TransferState.PENDING:
                state, done_at = await self._watch(handle, f"{what} with {peer}", started, timeout, landed, nbytes)
                inline = False
            else:
                done_at = polled_at
                inline = True
            failed = state is TransferState.FAILED
            if failed:
                raise TransferFailedError(f"KV {what} with {peer} failed (peer gone?)")
            if landed is not None and inline:  # a polled one was told by ``_watch``
                landed(nbytes)
            return Moved(nbytes, done_at - started, inline)
        finally:
            if clock is not None:
                clock.stop(done_at or time.perf_counter())
            self.poller.forget(handle)
            self.transport.release(handle)
            self._in_flight[peer] -= 1
            if failed is False:
                self._stale.discard(peer)
            elif failed or peer in self._stale:
                self._failed(peer)

    async def _watch(self, handle: object, what: str, started: float, timeout: float,
                     landed: Callable[[int], None] | None, nbytes: int) -> tuple[TransferState, float]:
        """The poller's verdict on a transfer in flight, within ``timeout`` of ``started``
        (``time.perf_counter``); cancelled meanwhile, it still waits for the transfer before
        the cancel goes on. ``landed`` is told once the transfer is DONE, whoever waits then."""
        watch = self.poller.watch(handle, what)
        if landed is not None:
            watch.add_done_callback(
                lambda w: landed(nbytes) if not w.cancelled() and w.result()[0] is TransferState.DONE else None)

        async def verdict() -> tuple[TransferState, float]:
            return await asyncio.wait_for(asyncio.shield(watch), max(0.0, started + timeout - time.perf_counter()))

        try:
            return await verdict()
        except TimeoutError:
            raise TransferFailedError(f"KV {what} did not finish within {timeout:.1f}s") from None
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):  # a second cancel, the deadline: the first cancel goes on
                await verdict()
            raise
        finally:
            watch.cancel()  # a no-op once it has its verdict

    def _failed(self, peer: str) -> None:
        """A transfer with ``peer`` failed: drop it now if nothing else is in flight with
        it, else when the last of those ends without one succeeding."""
        self._stale.add(peer)
        if self._in_flight.get(peer, 0) == 0:
            self._in_flight.pop(peer, None)
            self._stale.discard(peer)
            log.warning("a KV transfer with %s failed: its connection is dropped, made again on next use", peer)
            self.transport.remove_peer(peer)
