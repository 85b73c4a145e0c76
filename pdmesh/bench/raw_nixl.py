"""Raw NIXL write throughput between two processes: the ceiling the mesh's KV writes are
measured against (same block size, same blocks per write; one write at a time, polled
until DONE in a tight loop, the target progressing as a decode worker does)."""

from __future__ import annotations

import multiprocessing as mp
import time


def transfer_target(conn, block_bytes: int, blocks: int, name: str = "raw-dst",  # type: ignore[no-untyped-def]
                    interval: float | None = None) -> None:
    """A process's body: a NIXL agent over a zeroed pool that sends ``(metadata, base
    address)`` on ``conn``, then only drives UCX progress every ``interval`` seconds (a
    decode worker's await rate by default) until ``conn`` says stop."""
    import torch

    from pdmesh.kv.transfer.base import KVRegion
    from pdmesh.kv.transfer.nixl import NixlTransport
    from pdmesh.kv.transfer.poller import AWAIT_INTERVAL_S

    pool = torch.zeros(blocks, block_bytes // 4)  # registered: must outlive the agent
    t = NixlTransport(name, KVRegion.of_tensor(pool))
    conn.send((t.metadata(), t.base_addr))
    while not conn.poll(AWAIT_INTERVAL_S if interval is None else interval):
        t.progress()
    conn.recv()
    t.close()


def raw_nixl_gib_s(block_bytes: int, blocks: int) -> float:
    import torch

    from pdmesh.kv.transfer.base import KVRegion, PeerLayout, TransferState
    from pdmesh.kv.transfer.nixl import NixlTransport

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=transfer_target, args=(there, block_bytes, blocks))
    proc.start()
    meta, base = here.recv()
    pool = torch.randn(blocks, block_bytes // 4)
    src = NixlTransport("raw-src", KVRegion.of_tensor(pool))
    src.add_peer(PeerLayout("raw-dst", meta, base, block_bytes, blocks))
    ids = list(range(blocks))
    seconds = 0.0
    rounds = 20
    for i in range(rounds + 1):  # the first connects the agents: not counted
        t0 = time.perf_counter()
        h = src.write("raw-dst", ids, ids)
        while src.poll(h) is TransferState.PENDING:
            pass
        if i:
            seconds += time.perf_counter() - t0
        src.release(h)
    src.close()
    here.send("done")
    proc.join(30)
    return rounds * blocks * block_bytes / seconds / 2**30
