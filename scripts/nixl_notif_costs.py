"""What a KV write's notification costs when the receiver polls slowly (docs/performance.md §13).

    .venv/bin/python scripts/nixl_notif_costs.py

Two processes, one NIXL agent each over UCX, as a prefill and a decode worker: the sender
writes 16 blocks of 256 KiB (4 MiB, a 256-token prompt's KV) 30 times, polling its handle
every 0.1 ms; the receiver only polls notifications, every 0.5, 2 or 10 ms. Each interval
runs twice: the write carrying its notification (as the mesh sends its last write) and
the write alone. Prints p50 / min per write.
"""

from __future__ import annotations

import multiprocessing as mp
import time

BLOCK_BYTES, BLOCKS, WRITES = 256 * 1024, 16, 30


def _receiver(conn, name: str, interval: float) -> None:  # type: ignore[no-untyped-def]
    import torch

    from pdmesh.kv.transfer.base import KVRegion
    from pdmesh.kv.transfer.nixl import NixlTransport

    pool = torch.zeros(BLOCKS, BLOCK_BYTES // 4)  # registered: must outlive the agent
    t = NixlTransport(name, KVRegion.of_tensor(pool))
    conn.send((t.metadata(), t.base_addr))
    while not conn.poll(interval):
        t.take_notifs()
    conn.recv()
    t.close()


def run(run_id: int, interval: float, with_notif: bool) -> list[float]:
    import torch

    from pdmesh.kv.transfer.base import KVRegion, PeerLayout, TransferState
    from pdmesh.kv.transfer.nixl import NixlTransport

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    dst = f"notif-dst-{run_id}"  # fresh agent names: a closed agent's peers remember it
    proc = ctx.Process(target=_receiver, args=(there, dst, interval))
    proc.start()
    meta, base = here.recv()
    pool = torch.randn(BLOCKS, BLOCK_BYTES // 4)  # registered: must outlive the agent
    src = NixlTransport(f"notif-src-{run_id}", KVRegion.of_tensor(pool))
    src.add_peer(PeerLayout(dst, meta, base, BLOCK_BYTES, BLOCKS))
    ids = list(range(BLOCKS))
    times = []
    for i in range(WRITES):
        t0 = time.perf_counter()
        h = src.write(dst, ids, ids, f"t-{i}".encode() if with_notif else b"")
        while src.poll(h) is TransferState.PENDING:
            time.sleep(0.0001)
        times.append(time.perf_counter() - t0)
        src.release(h)
        time.sleep(0.003)
    here.send("done")
    proc.join(30)
    src.close()
    return sorted(times)


def main() -> None:
    for run_id, (interval, with_notif) in enumerate(
            (i, n) for i in (0.0005, 0.002, 0.01) for n in (True, False)):
        t = run(run_id, interval, with_notif)
        print(f"receiver polls every {1000 * interval:4.1f} ms, "
              f"{'with' if with_notif else 'without'} notification: "
              f"4 MiB write p50 {1000 * t[len(t) // 2]:.2f} ms, min {1000 * t[0]:.2f} ms")


if __name__ == "__main__":
    main()
