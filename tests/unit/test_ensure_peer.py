"""``Worker.ensure_peer`` returns with the peer registered, even when the connection it
waited on is dropped again before it resumes.

The race: requests of one prefill worker share one NIXL connection attempt to a decode
worker; when it lands, another request's failed write may drop the peer again
(``TransferRunner``) before the waiters resume, and each waiter then started a write to an
unregistered peer and failed it (six failed requests for two failed writes in a CI run).
Timing decides it in a mesh, so the peer registry here is a set and the drop is scheduled
by the connection itself: the one fault wrapper these tests use around ``ensure_peer``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pdmesh.errors import TransferFailedError
from pdmesh.rpc.single_flight import SingleFlight
from services.worker.worker import Worker


class Peers:
    """The peer registry a ``NixlTransport`` keeps, without NIXL."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def has_peer(self, name: str) -> bool:
        return name in self.names


def core_whose_connections_drop(drops: int) -> SimpleNamespace:
    """A core whose first ``drops`` connections are dropped right after they land, before
    any waiter resumes (as another request's failed write drops the peer)."""
    peers = Peers()
    worker = SimpleNamespace(transport=peers, _connects=SingleFlight(), connects=0)
    worker.connected = lambda worker_id: Worker.connected(worker, worker_id)  # type: ignore[arg-type]

    async def connect(worker_id: str, address: str, timeout: float, kvstore: bool) -> None:
        await asyncio.sleep(0.01)  # the Info call
        worker.connects += 1
        peers.names.add(worker_id)
        if worker.connects <= drops:
            asyncio.get_running_loop().call_soon(peers.names.discard, worker_id)

    worker._connect = connect
    return worker


def test_a_connection_dropped_before_the_waiters_resume_is_made_again() -> None:
    worker = core_whose_connections_drop(1)

    async def waiters() -> list[bool]:
        async def one() -> bool:
            await Worker.ensure_peer(worker, "decode-0", "127.0.0.1:1", timeout=2.0)  # type: ignore[arg-type]
            return worker.transport.has_peer("decode-0")  # what a write started now would see
        return await asyncio.gather(*(one() for _ in range(4)))

    assert asyncio.run(waiters()) == [True] * 4
    assert worker.connects == 2  # one shared attempt, dropped; one more, shared again


def test_a_peer_dropped_every_time_fails_by_the_deadline() -> None:
    worker = core_whose_connections_drop(10**6)
    with pytest.raises(TransferFailedError, match="dropped again"):
        asyncio.run(Worker.ensure_peer(worker, "decode-0", "127.0.0.1:1", timeout=0.2))  # type: ignore[arg-type]


def test_a_caller_waits_for_a_connection_still_warming_its_registered_peer() -> None:
    """``_connect`` registers the peer, then warms it with a read (``Worker._warm``); a
    caller arriving in between finds the peer registered and must still wait: its write
    would otherwise take UCX's handshake itself, pending until the peer polls."""
    peers = Peers()
    warmed = asyncio.Event()
    worker = SimpleNamespace(transport=peers, _connects=SingleFlight())
    worker.connected = lambda worker_id: Worker.connected(worker, worker_id)  # type: ignore[arg-type]

    async def connect(worker_id: str, address: str, timeout: float, kvstore: bool) -> None:
        peers.names.add(worker_id)
        await asyncio.sleep(0.05)  # the warming read
        warmed.set()

    worker._connect = connect

    async def callers() -> list[bool]:
        async def one(delay: float) -> bool:
            await asyncio.sleep(delay)
            await Worker.ensure_peer(worker, "decode-0", "127.0.0.1:1", timeout=2.0)  # type: ignore[arg-type]
            return warmed.is_set()
        return await asyncio.gather(one(0.0), one(0.01))  # the second finds the peer registered

    assert asyncio.run(callers()) == [True, True]
