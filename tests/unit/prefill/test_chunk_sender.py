"""A prompt's KV writes survive another request's failed write to the same decode worker.

A failed write drops the peer once nothing else is in flight with it (``TransferRunner``):
a request that connected before the drop and writes after it must connect again rather
than fail for the other request's fault. Real NIXL (two agents in this process over UCX)
and the real runner; the first write fails through the fault-injecting wrapper, since a
live pair cannot be made to fail one write on demand. The ``Worker`` around them is a
stand-in carrying only what ``ChunkSender`` touches; its connect adds the peer's layout
as the real one does from the peer's ``Info``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from pdmesh.errors import TransferFailedError
from pdmesh.kv.transfer.base import KVRegion, PeerLayout
from pdmesh.kv.transfer.faults import FailingWrites
from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.kv.transfer.runner import Moved, TransferRunner
from pdmesh.mesh_types import KvDestination
from services.prefill.chunk_sender import ChunkSender

BLOCKS, BLOCK_FLOATS = 8, 1024


class _Core:
    def __init__(self, transport: FailingWrites, peer: PeerLayout, blocks: dict[str, list[int]]) -> None:
        self.transport = transport
        self.transfers = TransferRunner(transport)
        self.peer = peer
        self.connects = 0
        self.engine = SimpleNamespace(block_ids_of=lambda rid: blocks[rid])
        self.async_engine = SimpleNamespace(call=lambda fn: fn(), watch_progress=lambda rid, fn: None)

    async def ensure_peer(self, worker_id: str, address: str, timeout: float) -> None:
        if not self.transport.has_peer(worker_id):
            self.connects += 1
            self.transport.add_peer(self.peer)

    async def write_kv(self, peer: str, src: list[int], dst: list[int], timeout: float) -> Moved:
        return await self.transfers.write(peer, src, dst, timeout)


@pytest.fixture()
def pools():  # type: ignore[no-untyped-def]
    src_pool = torch.randn(BLOCKS, BLOCK_FLOATS)
    dst_pool = torch.zeros(BLOCKS, BLOCK_FLOATS)
    src = NixlTransport("sender-src", KVRegion.of_tensor(src_pool))
    dst = NixlTransport("sender-dst", KVRegion.of_tensor(dst_pool))
    layout = PeerLayout("sender-dst", dst.metadata(), dst.base_addr, dst.block_bytes, BLOCKS)
    yield src, dst, layout, src_pool, dst_pool
    src.close()
    dst.close()


def _done(dest: KvDestination) -> asyncio.Future[KvDestination]:
    fut: asyncio.Future[KvDestination] = asyncio.get_running_loop().create_future()
    fut.set_result(dest)
    return fut


def test_a_request_connected_before_another_failed_write_writes_after_it(pools) -> None:  # type: ignore[no-untyped-def]
    src, dst, layout, src_pool, dst_pool = pools
    worker = _Core(FailingWrites(src, {1}), layout, {"a": [0, 1], "b": [2, 3]})

    async def go() -> tuple[int, bool, bool | None, bool | None]:
        receiver = TransferRunner(dst)
        receiver.poller.drive_progress(lambda: True)  # a UCX target progresses, as a decode worker does
        a = ChunkSender(worker, "a", _done(KvDestination("sender-dst", "-", (4, 5))), timeout=10)  # type: ignore[arg-type]
        b = ChunkSender(worker, "b", _done(KvDestination("sender-dst", "-", (6, 7))), timeout=10)  # type: ignore[arg-type]
        try:
            await a._connect()  # a's destination came and it is connected
            with pytest.raises(TransferFailedError):
                await b.finish(2)  # the worker's first write fails: the runner drops the peer
            dropped = not src.has_peer("sender-dst")
            sent = await a.finish(2)
        finally:
            worker.transfers.poller.close()
            receiver.poller.close()
        return sent, dropped, a.inline, b.inline

    sent, dropped, a_inline, b_inline = asyncio.run(go())
    assert dropped
    # how the KV landed is said only for writes that happened (the decode worker learns from it)
    assert b_inline is None and a_inline in (True, False)
    assert sent == 2 and worker.connects == 2
    assert torch.equal(dst_pool[4:6], src_pool[0:2])
