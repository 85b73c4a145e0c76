"""Raw NIXL write throughput between two processes: the ceiling the mesh's KV writes are
measured against (same block size, same blocks per write; one write at a time, polled
until DONE in a tight loop, the target progressing as a decode worker does).

Two ceilings: the same blocks rewritten every time (both ends stay in the CPU's caches:
the best any write can do), and every write from and to blocks not touched since the
pools were made, as a mesh writes a new request's blocks into a fresh reservation. On a
Zen 5 EPYC, 16-block (4 MiB) writes ran at 11.7-12.3 GiB/s the first way and 6.4-6.7 GiB/s
the second (``pdmesh bench mesh --sections kv``; docs/performance/log.md section 19). Both
pools are made as the workers make theirs (``engine/kv_pool.py``: huge pages where the host
allows), so the ceiling is for the same kind of memory as the mesh's writes."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator


def transfer_target(conn, block_bytes: int, blocks: int, name: str = "raw-dst",
                    interval: float | None = None) -> None:
    """A process's body: a NIXL agent over a zeroed pool that sends ``(metadata, base
    address)`` on ``conn``, then only drives UCX progress every ``interval`` seconds (a
    decode worker's await rate by default) until ``conn`` says stop."""
    import torch

    from pdmesh.engine.kv_pool import kv_pool
    from pdmesh.kv.transfer.base import KVRegion
    from pdmesh.kv.transfer.nixl import NixlTransport
    from pdmesh.kv.transfer.poller import AWAIT_INTERVAL_S

    pool, _ = kv_pool((blocks, block_bytes // 4), torch.float32, torch.device("cpu"))  # outlives the agent
    t = NixlTransport(name, KVRegion.of_tensor(pool))
    conn.send((t.metadata(), t.base_addr))
    while not conn.poll(AWAIT_INTERVAL_S if interval is None else interval):
        t.progress()
    conn.recv()
    t.close()


FRESH_WRITES = 32
"""Writes of a fresh-blocks run: the mesh bench's burst writes 32 requests' prompts."""
SAME_WRITES = 20
"""Writes timed when the same blocks are rewritten (they stay in cache: few are enough)."""


def pool_blocks(blocks: int, fresh: bool) -> int:
    """Blocks a pool needs for ``timed_writes``: one write's worth, or (fresh) one per write
    and the uncounted first."""
    return blocks * (FRESH_WRITES + 1) if fresh else blocks


def timed_writes(block_bytes: int, blocks: int, write: Callable[[list[int], list[int]], Callable[[], None] | None],
                 fresh_src: bool = False, fresh_dst: bool = False) -> float:
    """GiB/s of ``write(src_ids, dst_ids)`` over ``blocks``-block writes, the first not
    counted (it connects two agents, or faults a cache line in). ``fresh_src`` /
    ``fresh_dst``: each write reads / writes blocks no earlier write touched (pools of
    ``pool_blocks(blocks, True)``), else the same blocks every time. ``write`` may return
    what to do once its clock has stopped (releasing a NIXL handle). One loop for raw
    NIXL's ceilings and for ``copy_rates``' copies, so the two time the same shapes."""
    rounds = FRESH_WRITES if fresh_src or fresh_dst else SAME_WRITES
    seconds = 0.0
    for i in range(rounds + 1):
        src = list(range(i * blocks, (i + 1) * blocks)) if fresh_src else list(range(blocks))
        dst = list(range(i * blocks, (i + 1) * blocks)) if fresh_dst else list(range(blocks))
        t0 = time.perf_counter()
        after = write(src, dst)
        if i:
            seconds += time.perf_counter() - t0
        if after is not None:
            after()
    return rounds * blocks * block_bytes / seconds / 2**30
_TARGET_START_S = 120.0
"""The target imports torch and NIXL and registers its pool: seconds, never minutes."""


def target_ready(conn, proc, timeout: float = _TARGET_START_S):
    """The target's ``(metadata, base address)``; an error, not a hang, if it died first
    (a script without a ``__main__`` guard re-runs itself in a spawned child) or is stuck."""
    deadline = time.monotonic() + timeout
    while not conn.poll(0.1):
        if not proc.is_alive():
            raise RuntimeError(f"the raw NIXL target process exited ({proc.exitcode}) before it was ready")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"the raw NIXL target was not ready within {timeout:.0f}s")
    return conn.recv()


WRITE_DEADLINE_S = 30.0
"""A raw write of a few MiB takes milliseconds; one still running after this is stuck."""


def wait_written(transport, handle, spin_s: float = 0.0) -> None:
    """Poll a raw write until DONE (sleeping ``spin_s`` between polls, 0: a tight loop); an
    error if it fails or is still running after ``WRITE_DEADLINE_S``."""
    from pdmesh.kv.transfer.base import TransferState

    deadline = time.monotonic() + WRITE_DEADLINE_S
    while (state := transport.poll(handle)) is TransferState.PENDING:
        if time.monotonic() > deadline:
            raise TimeoutError(f"a raw NIXL write was still running after {WRITE_DEADLINE_S:.0f}s")
        if spin_s:
            time.sleep(spin_s)
    if state is TransferState.FAILED:
        raise RuntimeError("a raw NIXL write failed (the target process gone?)")


_TARGET_STOP_S = 30.0
"""A target told to stop closes its agent and exits; one still alive after this is killed."""


@contextlib.contextmanager
def raw_target(block_bytes: int, blocks: int, name: str = "raw-dst",
               interval: float | None = None) -> Iterator[tuple[bytes, int]]:
    """A ``transfer_target`` process for the block: its ``(metadata, base address)``. On
    the way out, however the block ends (a failed or stuck write included), the target is
    told to stop and killed if it has not within ``_TARGET_STOP_S``: a target left waiting
    would hold the caller's exit, which joins its children."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=transfer_target, args=(there, block_bytes, blocks, name, interval))
    proc.start()
    try:
        yield target_ready(here, proc)
    finally:
        with contextlib.suppress(OSError):  # the target may be gone already
            here.send("done")
        proc.join(_TARGET_STOP_S)
        if proc.is_alive():
            proc.kill()
            proc.join(_TARGET_STOP_S)


def raw_nixl_gib_s(block_bytes: int, blocks: int, fresh: bool = False) -> float:
    """GiB/s of ``blocks``-block writes; ``fresh``: each write from and to blocks no earlier
    write touched (pools of ``FRESH_WRITES`` writes' blocks), else the same blocks each time."""
    import torch

    from pdmesh.engine.kv_pool import kv_pool
    from pdmesh.kv.transfer.base import KVRegion, PeerLayout
    from pdmesh.kv.transfer.nixl import NixlTransport

    pool_size = pool_blocks(blocks, fresh)
    pool, _ = kv_pool((pool_size, block_bytes // 4), torch.float32, torch.device("cpu"))  # outlives the agent
    pool.normal_()
    with raw_target(block_bytes, pool_size) as (meta, base):
        src = NixlTransport("raw-src", KVRegion.of_tensor(pool))
        try:
            src.add_peer(PeerLayout("raw-dst", meta, base, block_bytes, pool_size))

            def write(src_ids: list[int], dst_ids: list[int]) -> Callable[[], None]:
                h = src.write("raw-dst", src_ids, dst_ids)
                wait_written(src, h)
                return lambda: src.release(h)

            return timed_writes(block_bytes, blocks, write, fresh_src=fresh, fresh_dst=fresh)
        finally:
            src.close()
