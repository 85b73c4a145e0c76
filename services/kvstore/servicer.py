"""kvstore: a CPU-memory block pool keyed by block hash, shared by the prefill workers.

Lifecycle of a block: a prefill worker ``Reserve``s slots for the prompt blocks it just
computed, WRITEs them over NIXL and ``Commit``s; later, a prefill worker that misses locally
``Lookup``s the prompt's chain, READs the pinned slots into its own blocks and skips
recomputing them. Eviction is LRU within the byte budget and never takes a pinned slot.
"""

from __future__ import annotations

import grpc

from pdmesh.rpc.convert import info_to_proto
from pdmesh.telemetry import tracing
from pdmesh.v1 import kvstore_pb2, kvstore_pb2_grpc, worker_pb2
from services.kvstore.pace import ProgressPace
from services.kvstore.pool import StorePool

SERVICE = "pdmesh.v1.KVStore"


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, pool: StorePool, pace: ProgressPace) -> None:
        self.pool = pool
        self.pace = pace

    async def Info(self, request, context) -> worker_pb2.WorkerInfo:  # noqa: N802
        return info_to_proto(self.pool.info())

    async def Lookup(self, request, context) -> kvstore_pb2.LookupResponse:  # noqa: N802
        span = tracing.start_span("kvstore.get", tracing.incoming(context), blocks=len(request.block_hashes))
        slots = self.pool.store.lookup(list(request.block_hashes), (request.pin_ms or 10_000) / 1000)
        if slots:
            self.pace.reads_expected()
        span.set_attribute("pdmesh.hit_blocks", len(slots))
        span.end()
        return kvstore_pb2.LookupResponse(slot_ids=slots)

    async def Reserve(self, request, context) -> kvstore_pb2.StoreReserveResponse:  # noqa: N802
        span = tracing.start_span("kvstore.put", tracing.incoming(context), blocks=len(request.block_hashes))
        rid, slots = self.pool.store.reserve(list(request.block_hashes))
        self.pace.writes_expected()
        span.set_attribute("pdmesh.new_blocks", sum(1 for s in slots if s >= 0))
        span.end()
        return kvstore_pb2.StoreReserveResponse(slot_ids=slots, reservation_id=rid)

    async def Commit(self, request, context) -> kvstore_pb2.CommitResponse:  # noqa: N802
        return kvstore_pb2.CommitResponse(committed=self.pool.store.commit(request.reservation_id, request.ok))


def add_to_server(server: grpc.aio.Server, pool: StorePool, pace: ProgressPace) -> None:
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(KVStoreServicer(pool, pace), server)
