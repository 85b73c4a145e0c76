"""Send a prompt's KV to the decode worker while later prefill chunks are still computing.

After every engine step that completes more full prompt blocks, the blocks finished since
the last write (and not already cached on the decode worker) are written with one NIXL
WRITE. When the prompt is done, ``finish`` writes what is left — the last, partial block
included — and returns once every write is DONE, i.e. in the decode worker's memory: the
``Prefill`` response that follows is what tells the router, and its ``Decode`` the decode
worker, that the KV has landed. Full blocks are never written again by the engine, so
sending them early is safe; the request owns them until it is released.

The destination may come after the prefill started (``PrefillStream``: the router reserves
on the decode worker while the prompt computes): nothing is written until it has come,
then everything finished so far goes at once.
"""

from __future__ import annotations

import asyncio

from pdmesh.mesh_types import KvDestination
from services.worker.worker import Worker


class ChunkSender:
    def __init__(self, worker: Worker, rid: str, destination: asyncio.Future[KvDestination], timeout: float,
                 span=None) -> None:
        self.worker = worker
        self.rid = rid
        self.destination = destination
        self.dest: KvDestination | None = None
        """Set once the destination came and this worker first connected to it."""
        self.timeout = timeout
        self.sent = 0
        """Prompt blocks [first_block, sent) are on the decode worker."""
        self.ready = 0
        self.overlapped_blocks = 0
        self.bytes = 0
        self.inline: bool | None = None
        """None until a write; then whether every write landed within its own call."""
        self._wake = asyncio.Event()
        self._error: BaseException | None = None
        self._closing = False
        self._span = span
        """The prefill span: one event per prefill chunk that completed blocks."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.worker.async_engine.watch_progress(self.rid, self.advance)
        self._task = asyncio.create_task(self._run())

    def advance(self, full_blocks: int) -> None:
        if self._span is not None:
            self._span.add_event("prefill_chunk", {"pdmesh.full_blocks": full_blocks})
        if full_blocks > self.ready:
            self.ready = full_blocks
            self._wake.set()

    async def _connect(self) -> KvDestination:
        """The destination, once it came (at most ``timeout``) and NIXL reaches it.

        The connection is checked again before every write, with nothing awaited between
        the check and the write's start: another request's failed write to the same
        decode worker drops the peer (``TransferRunner``), and a write posted after
        that on the strength of an earlier check would fail to start: a second request
        failed for the first one's fault."""
        dest = self.dest
        if dest is None:
            dest = await asyncio.wait_for(asyncio.shield(self.destination), self.timeout)
        await self.worker.ensure_peer(dest.worker_id, dest.worker_address, timeout=min(self.timeout, 5.0))
        if self.dest is None:
            self.dest, self.sent = dest, dest.first_block
        return dest

    async def _run(self) -> None:
        try:
            await self._connect()
            self._wake.set()  # what finished while the destination was on its way
            while not self._closing:
                await self._wake.wait()
                self._wake.clear()
                if self.ready > self.sent and not self._closing:
                    self.overlapped_blocks += await self._write(self.sent, self.ready)
        except Exception as exc:  # noqa: BLE001 - surfaced by finish()
            self._error = exc

    async def _write(self, start: int, end: int) -> int:
        dest = await self._connect()
        end = min(end, dest.first_block + len(dest.block_ids))
        if end <= start:
            return 0
        src = self.worker.async_engine.call(lambda: self.worker.engine.block_ids_of(self.rid))[start:end]
        dst = list(dest.block_ids[start - dest.first_block : end - dest.first_block])
        moved = await self.worker.write_kv(dest.worker_id, src, dst, self.timeout)
        self.bytes += moved.bytes
        self.inline = moved.inline and self.inline is not False
        self.sent = end
        return end - start

    async def finish(self, total_blocks: int) -> int:
        """Write the remaining blocks; returns blocks sent in all, once all have landed."""
        await self.stop()
        if self._error is not None:
            raise self._error
        dest = await self._connect()
        if self.sent < total_blocks:
            await self._write(self.sent, total_blocks)
        return self.sent - dest.first_block

    async def stop(self) -> None:
        """Stop watching; a write in progress completes first (never abandoned mid-flight),
        a wait for the destination does not."""
        self.worker.async_engine.watch_progress(self.rid, None)
        self._closing = True
        self._wake.set()
        if self._task is not None:
            if self.dest is None:
                self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
