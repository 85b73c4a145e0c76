"""The prefill worker's side of the kvstore tier: fetch before computing, offload after.

fetch   — before a prompt is admitted, the leading blocks this worker lacks are looked up in
          the kvstore (pinned there), READ into freshly taken local blocks and registered as
          local prefix cache, so the engine's admission hits them instead of recomputing.
offload — after the decode worker has its KV, the prompt's full blocks the store lacks are
          WRITTEN into slots it reserved and committed; the worker's held blocks are freed
          only after that (or after it failed).
A kvstore that is down or slow costs the cache, never the request: failures are logged and
counted, and the request goes on as if the store had missed.
"""

from __future__ import annotations

import logging
import time

import grpc

from pdmesh.errors import TransferFailedError
from pdmesh.kv.block_hash import extra_keys_for
from pdmesh.rpc.kvstore_client import KVStoreClient
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry import tracing
from services.worker.core import WorkerCore

log = logging.getLogger(__name__)
_FAILURES = (grpc.aio.AioRpcError, TransferFailedError)


class KVStoreTier:
    def __init__(self, core: WorkerCore, address: str, timeout: float = 10.0) -> None:
        self.core = core
        self.client = KVStoreClient(address)
        self.timeout = timeout
        """Deadline of each NIXL read or write, and how long a lookup pins its slots."""
        self.peer = ""
        self.failures = 0

    async def _connect(self) -> str:
        """The store's NIXL peer, connected. Called right before each transfer with nothing
        awaited between: another transfer's failure may have dropped the peer meanwhile
        (``TransferRunner``), and a transfer to a dropped peer fails to start."""
        if not self.peer or not self.core.transport.has_peer(self.peer):
            info = await self.client.info()
            await self.core.ensure_peer(info.worker_id, self.client.address, 2.0, kvstore=True)
            self.peer = info.worker_id
        return self.peer

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        log.warning("kvstore %s failed (%s); continuing without it", what, exc)

    async def fetch(self, ids: list[int], params: SamplingParams, ctx=None) -> int:  # type: ignore[no-untyped-def]
        """Import the prompt's leading blocks the store has and we lack; returns tokens imported."""
        core = self.core
        eng = core.engine
        bs = eng.kv.block_size
        hashes = eng.hasher.hash_tokens(ids[: (len(ids) - 1) // bs * bs], extra_keys_for(params.cache_salt))

        def local_hits() -> int:
            n = 0
            while n < len(hashes) and eng.pool.lookup(hashes[n], ids[n * bs : (n + 1) * bs]) is not None:
                n += 1
            return n

        local = core.aeng.call(local_hits)
        if local == len(hashes):
            return 0
        started = time.perf_counter()
        try:
            slots = await self.client.lookup(hashes[local:], int(self.timeout * 1000), tracing.outgoing(ctx))
        except _FAILURES as exc:
            self._failed("lookup", exc)
            return 0
        n = len(slots)
        blocks = core.aeng.call(lambda: eng.handoff.import_start(n)) if n else None
        if not blocks:
            return 0
        ok = False
        try:
            peer = await self._connect()
            await core.transfers.read(peer, [b.block_id for b in blocks], slots, self.timeout)
            ok = True
        except _FAILURES as exc:
            self._failed("read", exc)
        finally:
            chunks = [ids[(local + i) * bs : (local + i + 1) * bs] for i in range(n)]
            parent = hashes[local - 1] if local else None
            core.aeng.call(lambda: eng.handoff.import_finish(
                blocks, hashes[local : local + n], chunks, parent, ok))
        if not ok:
            return 0
        core.counters.kvstore_fetched_tokens += n * bs
        core.kvstore_cost.observe(n * bs, time.perf_counter() - started)
        return n * bs

    async def offload(self, request_id: str, ctx=None) -> None:  # type: ignore[no-untyped-def]
        """Copy the held prompt's full blocks the store lacks into it (call before release)."""
        core = self.core
        hashes, block_ids = core.aeng.call(lambda: core.engine.handoff.offload_plan(request_id))
        if not hashes:
            return
        meta = tracing.outgoing(ctx)
        try:
            reservation, slots = await self.client.reserve(hashes, meta)
        except _FAILURES as exc:
            self._failed("reserve", exc)
            return
        pairs = [(b, s) for b, s in zip(block_ids, slots) if s >= 0]
        ok = False
        try:
            if pairs:
                peer = await self._connect()
                await core.transfers.write(peer, [b for b, _ in pairs], [s for _, s in pairs], self.timeout)
            ok = True
        except _FAILURES as exc:
            self._failed("write", exc)
        finally:
            try:
                await self.client.commit(reservation, ok, meta)
            except _FAILURES as exc:
                self._failed("commit", exc)
        if ok:
            core.counters.kvstore_offloaded_blocks += len(pairs)
