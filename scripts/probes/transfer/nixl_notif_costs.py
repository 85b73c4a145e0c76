"""What a NIXL notification costs a KV write when the target polls slowly (docs/performance/log.md
§13, §15).

    .venv/bin/python scripts/probes/transfer/nixl_notif_costs.py

Two processes, one NIXL agent each over UCX, as a prefill and a decode worker: the sender
writes 16 blocks of 256 KiB (4 MiB, a 256-token prompt's KV) 30 times, polling its handle
every 0.1 ms until DONE; the target only drives progress, every 2 or 10 ms. Three ways:
- ``plain``: the write alone (what the mesh does: the RPC that follows tells the target);
- ``carried``: the write carries a notification (NIXL's own "data has landed" signal);
- ``after``: a notification sent on its own after each write is DONE — the *next* write
  is what it delays: the notification holds the connection until the target polls.
Prints p50 / p90 per write.
"""

from __future__ import annotations

import argparse
import time

from pdmesh.bench.raw_nixl import raw_target, wait_written

BLOCK_BYTES, BLOCKS, WRITES = 256 * 1024, 16, 30
WAYS = ("plain", "carried", "after")


def run(run_id: int, interval: float) -> dict[str, list[float]]:
    import torch

    from pdmesh.kv.transfer.base import KVRegion, PeerLayout
    from pdmesh.kv.transfer.nixl import NixlTransport

    dst = f"notif-dst-{run_id}"  # fresh agent names: a closed agent's peers remember it
    pool = torch.randn(BLOCKS, BLOCK_BYTES // 4)  # registered: must outlive the agent
    times: dict[str, list[float]] = {}
    with raw_target(BLOCK_BYTES, BLOCKS, dst, interval) as (meta, base):
        src = NixlTransport(f"notif-src-{run_id}", KVRegion.of_tensor(pool))
        try:
            src.add_peer(PeerLayout(dst, meta, base, BLOCK_BYTES, BLOCKS))
            agent, (_, remote) = src.agent, src._peers[dst]  # type: ignore[misc]  # NIXL's own calls
            ids = list(range(BLOCKS))
            for way in WAYS:
                times[way] = []
                for i in range(WRITES):
                    t0 = time.perf_counter()
                    if way == "carried":
                        h = agent.make_prepped_xfer("WRITE", src._local, ids, remote, ids, f"t-{i}".encode())
                        agent.transfer(h)
                    else:
                        h = src.write(dst, ids, ids)
                    wait_written(src, h, spin_s=0.0001)
                    times[way].append(time.perf_counter() - t0)
                    src.release(h)
                    if way == "after":
                        agent.send_notif(dst, f"n-{i}".encode())
                    time.sleep(0.003)
                times[way].sort()
        finally:
            src.close()
    return times


def main() -> None:
    for run_id, interval in enumerate((0.002, 0.01)):
        times = run(run_id, interval)
        for way in WAYS:
            t = times[way]
            print(f"target progresses every {1000 * interval:4.1f} ms, {way:8s}: "
                  f"4 MiB write p50 {1000 * t[len(t) // 2]:.2f} ms, p90 {1000 * t[int(len(t) * 0.9)]:.2f} ms")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
