"""KV transfers are driven by the poller's thread, not by the event loop (real NIXL, two
agents in this process over UCX)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from pdmesh.errors import TransferFailedError
from pdmesh.kv.transfer.base import KVRegion, PeerLayout, TransferState
from pdmesh.kv.transfer.faults import DelayedWrites, FailingWrites
from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.kv.transfer.runner import TransferRunner

BLOCKS, BLOCK_FLOATS = 16, 64 * 1024  # 256 KiB blocks, 4 MiB in all


@pytest.fixture(scope="module")
def pair():  # type: ignore[no-untyped-def]
    src_pool = torch.randn(BLOCKS, BLOCK_FLOATS)
    dst_pool = torch.zeros(BLOCKS, BLOCK_FLOATS)
    src = NixlTransport("poller-src", KVRegion.of_tensor(src_pool))
    dst = NixlTransport("poller-dst", KVRegion.of_tensor(dst_pool))
    src.add_peer(PeerLayout("poller-dst", dst.metadata(), dst.base_addr, dst.block_bytes, BLOCKS))
    yield src, dst, src_pool, dst_pool
    src.close()
    dst.close()


def test_a_write_is_in_the_targets_memory_when_it_is_done(pair) -> None:  # type: ignore[no-untyped-def]
    """What ``Decode`` relies on: once the write returns, the target holds the blocks (read
    at once, with no notification and nothing else in between)."""
    src, dst, src_pool, dst_pool = pair
    dst_pool.zero_()

    async def go() -> tuple[int, bool, bool]:
        receiver = TransferRunner(dst)
        receiver.poller.drive_progress(lambda: True)
        runner = TransferRunner(src)
        try:
            moved = await runner.write("poller-dst", [0, 1, 2], [5, 6, 7], timeout=10)
            landed = torch.equal(dst_pool[5:8], src_pool[0:3])  # before anything else runs
            untouched = not dst_pool[:5].any()
        finally:
            runner.poller.close()
            receiver.poller.close()
        return moved.bytes, landed, untouched

    moved, landed, untouched = asyncio.run(go())
    assert moved == 3 * src.block_bytes
    assert landed and untouched


def test_a_transfer_completes_while_the_event_loop_is_blocked(pair) -> None:  # type: ignore[no-untyped-def]
    """The loop is stuck right after starting the write (as a loop busy with other
    requests' messages is): the blocks land and the poller marks the write done while it
    is. (Over some transports UCX moves a write only while its target progresses too, as
    a decode worker's poller does; this one drives the target's progress the same way.)"""
    src, dst, src_pool, dst_pool = pair
    dst_pool.zero_()

    async def go() -> tuple[float, float]:
        runner, receiver = TransferRunner(src), TransferRunner(dst)
        receiver.poller.drive_progress(lambda: True)
        try:
            task = asyncio.create_task(runner.write("poller-dst", list(range(BLOCKS)), list(range(BLOCKS)),
                                                    timeout=10))
            await asyncio.sleep(0)  # the write starts
            blocked = time.perf_counter()
            deadline = time.monotonic() + 10
            while not torch.equal(dst_pool, src_pool):  # the loop is busy until the blocks land
                assert time.monotonic() < deadline, "the write did not land while the loop was blocked"
            time.sleep(0.3)  # and stays busy a while after
            blocked_s = time.perf_counter() - blocked
            return (await task).seconds, blocked_s
        finally:
            runner.poller.close()
            receiver.poller.close()

    seconds, blocked_s = asyncio.run(go())
    # Timed by the poller's thread: had the loop finished the write, it would count the block.
    assert seconds < blocked_s - 0.2, (seconds, blocked_s)


def test_a_write_that_never_finishes_fails_at_its_deadline_and_is_released(pair) -> None:  # type: ignore[no-untyped-def]
    src, _, _, _ = pair
    stuck = DelayedWrites(src, delay_s=60)
    released: list[object] = []
    stuck.release = released.append  # type: ignore[method-assign]

    async def go() -> None:
        runner = TransferRunner(stuck)
        try:
            await runner.write("poller-dst", [0], [0], timeout=0.2)
        finally:
            assert runner.poller.watching == 0  # forgotten before release
            runner.poller.close()

    started = time.monotonic()
    with pytest.raises(TransferFailedError, match="did not finish within 0.2s"):
        asyncio.run(go())
    assert time.monotonic() - started < 5  # the deadline is the feature: 0.2 s, and a write stuck for 60

    assert len(released) == 1


class _FailingPoll:
    """The real transport, except that polling raises (a peer that died mid-transfer)."""

    def __init__(self, inner: NixlTransport) -> None:
        self.inner = inner
        self.removed: list[str] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    def poll(self, handle: object) -> TransferState:
        raise RuntimeError("NIXL_ERR_REMOTE_DISCONNECT")

    def remove_peer(self, name: str) -> None:
        self.removed.append(name)


def test_a_transfer_whose_poll_fails_drops_the_peer(pair) -> None:  # type: ignore[no-untyped-def]
    src, _, _, _ = pair
    failing = _FailingPoll(src)

    async def go() -> None:
        runner = TransferRunner(failing)  # type: ignore[arg-type]
        try:
            await runner.write("poller-dst", [0], [0], timeout=10)
        finally:
            runner.poller.close()

    with pytest.raises(TransferFailedError, match="failed"):
        asyncio.run(go())
    assert failing.removed == ["poller-dst"]


class _KeptPeers(FailingWrites):
    """``FailingWrites`` that records the peers the runner drops instead of dropping them."""

    def __init__(self, inner, fail: set[int]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner, fail)
        self.removed: list[str] = []

    def remove_peer(self, name: str) -> None:
        self.removed.append(name)


def test_a_failed_write_keeps_the_peer_while_another_is_in_flight(pair) -> None:  # type: ignore[no-untyped-def]
    """Write 1 is real and still in flight when write 2 fails: dropping the peer at once
    failed write 1 too (NIXL_ERR_NOT_FOUND at its next poll). Write 1 completes, and its
    success says the connection works, so the peer is not dropped afterwards either."""
    src, dst, src_pool, dst_pool = pair
    dst_pool.zero_()
    transport = _KeptPeers(DelayedWrites(src, delay_s=0.3), {2})

    async def go() -> tuple[object, object]:
        runner, receiver = TransferRunner(transport), TransferRunner(dst)  # type: ignore[arg-type]
        receiver.poller.drive_progress(lambda: True)
        try:
            first = asyncio.create_task(runner.write("poller-dst", [0, 1], [8, 9], timeout=10))
            await asyncio.sleep(0)  # write 1 starts (and waits out its delay)
            second = await asyncio.gather(runner.write("poller-dst", [2], [10], timeout=10),
                                          return_exceptions=True)
            assert transport.removed == []  # write 1 is in flight
            return await first, second[0]
        finally:
            runner.poller.close()
            receiver.poller.close()

    moved, failure = asyncio.run(go())
    assert isinstance(failure, TransferFailedError)
    assert moved.bytes == 2 * src.block_bytes  # type: ignore[attr-defined]
    assert torch.equal(dst_pool[8:10], src_pool[0:2])
    assert transport.removed == []


class _CountingProgress:
    """The real transport, counting progress passes."""

    def __init__(self, inner: NixlTransport) -> None:
        self.inner = inner
        self.polls = 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    def progress(self) -> None:
        self.polls += 1
        self.inner.progress()


def test_an_idle_receiver_polls_rarely_and_a_poke_moves_it_to_the_await_rate(pair) -> None:  # type: ignore[no-untyped-def]
    """Idle, a decode worker's poller wakes every ``idle_interval_s`` (its wake-ups slow
    every process beside it); a reservation pokes it onto the await rate at once. With an
    idle interval of a minute, a poke that were not seen, or a rate not re-read, could
    only show as a poll a minute later: each wait below gives up after seconds."""
    from pdmesh.kv.transfer.poller import TransferPoller

    _, dst, _, _ = pair
    counting = _CountingProgress(dst)
    awaiting = False

    def until(polls: int) -> None:
        deadline = time.monotonic() + 5
        while counting.polls < polls:
            assert time.monotonic() < deadline, f"{counting.polls} polls, not {polls}"
            time.sleep(0.001)

    poller = TransferPoller(counting, idle_interval_s=60.0)  # type: ignore[arg-type]
    poller.drive_progress(lambda: awaiting)
    try:
        until(1)  # the pass that starts driving
        time.sleep(0.3)
        assert counting.polls == 1  # idle: the next pass is a minute away
        awaiting = True
        poller.poke()
        until(2)  # the poke is a pass at once
        until(12)  # and the await rate (2 ms) from then on
    finally:
        poller.close()
