"""The prefill worker's side of the kvstore tier: fetch before computing, offload after.

fetch   — before a prompt is admitted, the leading blocks this worker lacks are looked up in
          the kvstore (pinned there), READ into freshly taken local blocks and registered as
          local prefix cache, so the engine's admission hits them instead of recomputing.
          The lookup is skipped when the router's prefix-index lookup, which lists what the
          store publishes, already says the store holds no more of the prompt than this
          worker: one gRPC round trip less before a fresh prompt's first token (1.5-1.9
          ms on a 2-core machine, docs/performance/log.md §27).
offload — after the decode worker has its KV, the prompt's full blocks the store lacks are
          WRITTEN into slots it reserved and committed; the worker's held blocks are freed
          only after that (or after it failed).
A kvstore that is down or slow costs the cache, never the request: failures are logged and
counted, and the request goes on as if the store had missed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping

import grpc

from pdmesh.errors import TransferFailedError
from pdmesh.kv.block_hash import extra_keys_for
from pdmesh.mesh_types import WorkerInfo
from pdmesh.rpc.kvstore_client import KVStoreClient
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry import tracing
from services.worker.worker import Worker

log = logging.getLogger(__name__)
_FAILURES = (grpc.aio.AioRpcError, TransferFailedError)


def index_answers(listed: Mapping[str, int] | None, store: WorkerInfo | None, local: int) -> bool:
    """Whether the router's index view of a prompt (``listed``: leading blocks per holder
    beyond the prefill workers; None: the router did not read the index) already says the
    ``store`` holds at most the ``local`` leading blocks this worker has. Only a store that
    publishes into the index is listed there; one that does not, or whose Info has not
    come, is asked. A view that lags the store (it publishes a block moments after
    committing it) costs a recompute, never a wrong block."""
    if listed is None or store is None or not store.publishes_index:
        return False
    return listed.get(store.worker_id, 0) <= local


class KVStoreTier:
    def __init__(self, worker: Worker, address: str, timeout: float = 10.0) -> None:
        self.worker = worker
        self.client = KVStoreClient(address)
        self.timeout = timeout
        """Deadline of each NIXL read or write, and how long a lookup pins its slots."""
        self.peer = ""
        self.failures = 0
        self.store: WorkerInfo | None = None
        """The store's latest Info: its id names its entries in the router's index view."""

    async def _store_info(self) -> WorkerInfo:
        self.store = await self.client.info()
        return self.store

    async def _connect(self) -> str:
        """The store's NIXL peer, connected. Called right before each transfer with nothing
        awaited between: another transfer's failure may have dropped the peer meanwhile
        (``TransferRunner``), and a transfer to a dropped peer fails to start."""
        if not self.peer or not self.worker.connected(self.peer):
            info = await self._store_info()
            await self.worker.ensure_peer(info.worker_id, self.client.address, 2.0, kvstore=True)
            self.peer = info.worker_id
        return self.peer

    async def _index_has_answered(self, listed: Mapping[str, int] | None, local: int) -> bool:
        """``index_answers`` for this worker's store, its Info asked for once."""
        if listed is not None and self.store is None:
            with contextlib.suppress(*_FAILURES):  # not answered: the lookup says what is wrong with the store
                await self._store_info()
        return index_answers(listed, self.store, local)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        log.warning("kvstore %s failed (%s); continuing without it", what, exc)

    async def fetch(self, ids: list[int], params: SamplingParams,
                    listed: Mapping[str, int] | None = None, ctx=None) -> int:
        """Import the prompt's leading blocks the store has and we lack; returns tokens
        imported. ``listed``: the router's index view of the prompt (``_index_has_answered``)."""
        worker = self.worker
        eng = worker.engine
        bs = eng.kv.block_size
        hashes = eng.hasher.hash_tokens(ids[: (len(ids) - 1) // bs * bs], extra_keys_for(params.cache_salt))

        def local_hits() -> int:
            n = 0
            while n < len(hashes) and eng.pool.lookup(hashes[n], ids[n * bs : (n + 1) * bs]) is not None:
                n += 1
            return n

        local = worker.async_engine.call(local_hits)
        if local == len(hashes):
            return 0
        if await self._index_has_answered(listed, local):
            worker.counters.kvstore_lookups_skipped += 1
            return 0
        worker.counters.kvstore_lookups += 1
        started = time.perf_counter()
        try:
            slots = await self.client.lookup(hashes[local:], int(self.timeout * 1000), tracing.outgoing(ctx))
        except _FAILURES as exc:
            self._failed("lookup", exc)
            return 0
        n = len(slots)
        blocks = worker.async_engine.call(lambda: eng.handoff.import_start(n)) if n else None
        if not blocks:
            return 0
        ok = False
        try:
            peer = await self._connect()
            await worker.transfers.read(peer, [b.block_id for b in blocks], slots, self.timeout)
            ok = True
        except _FAILURES as exc:
            self._failed("read", exc)
        finally:
            chunks = [ids[(local + i) * bs : (local + i + 1) * bs] for i in range(n)]
            parent = hashes[local - 1] if local else None
            worker.async_engine.call(lambda: eng.handoff.import_finish(
                blocks, hashes[local : local + n], chunks, parent, ok))
        if not ok:
            return 0
        worker.counters.kvstore_fetched_tokens += n * bs
        worker.kvstore_cost.observe(n * bs, time.perf_counter() - started)
        return n * bs

    async def offload(self, request_id: str, ctx=None) -> None:
        """Copy the held prompt's full blocks the store lacks into it (call before release)."""
        worker = self.worker
        hashes, block_ids = worker.async_engine.call(lambda: worker.engine.handoff.offload_plan(request_id))
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
                await worker.transfers.write(peer, [b for b, _ in pairs], [s for _, s in pairs], self.timeout)
            ok = True
        except _FAILURES as exc:
            self._failed("write", exc)
        finally:
            try:
                await self.client.commit(reservation, ok, meta)
            except _FAILURES as exc:
                self._failed("commit", exc)
        if ok:
            worker.counters.kvstore_offloaded_blocks += len(pairs)
