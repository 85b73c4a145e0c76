"""kvstore: a CPU-memory block pool keyed by block hash, shared by the prefill workers.

Lifecycle of a block: a prefill worker ``Reserve``s slots for the prompt blocks it just
computed, WRITEs them over NIXL and ``Commit``s; later, a prefill worker that misses locally
``Lookup``s the prompt's chain, READs the pinned slots into its own blocks and skips
recomputing them. Eviction is LRU within the byte budget and never takes a pinned slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry

from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.model.config import ModelConfig
from pdmesh.model.loader import resolve_dtype
from pdmesh.rpc.server import create_server, serve_until_signal, set_serving
from pdmesh.serving.worker_core import advertised, compat_hash, write_port_file
from pdmesh.telemetry import tracing
from pdmesh.telemetry.metrics import SnapshotCollector, serve_metrics
from pdmesh.v1 import kvstore_pb2, kvstore_pb2_grpc, worker_pb2
from services.kvstore.config import KVStoreConfig
from services.kvstore.store import BlockStore

log = logging.getLogger(__name__)
NAMES = ["pdmesh.v1.KVStore"]


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, cfg: KVStoreConfig, address: str) -> None:
        mc = ModelConfig.from_dir(cfg.model)
        dtype = resolve_dtype(cfg.dtype, mc)
        layout = (mc.num_layers, 2, cfg.block_size, mc.num_kv_heads, mc.head_dim)
        block_bytes = torch.empty(layout, dtype=dtype, device="meta").numel() * dtype.itemsize
        capacity = max(1, int(cfg.memory_gb * 2**30) // block_bytes)
        self.cfg = cfg
        self.address = address
        self.epoch = uuid.uuid4().hex[:12]
        self.pool = torch.zeros((capacity, *layout), dtype=dtype)
        self.transport = NixlTransport(cfg.worker_id, self.pool)
        self.store = BlockStore(capacity)
        self.compat = compat_hash(cfg.model, str(dtype).split(".")[-1], cfg.block_size,
                                  cfg.hash_algorithm, cfg.hash_seed, layout)
        self.dtype_name = str(dtype).split(".")[-1]

    async def Info(self, request, context) -> worker_pb2.WorkerInfo:  # noqa: N802
        s = self.store
        return worker_pb2.WorkerInfo(
            worker_id=self.cfg.worker_id, role=worker_pb2.WORKER_ROLE_KVSTORE,
            model=Path(self.cfg.model).name, dtype=self.dtype_name, block_size=self.cfg.block_size,
            hash_algorithm=self.cfg.hash_algorithm, hash_seed=self.cfg.hash_seed,
            num_blocks=s.capacity, free_blocks=len(s.free), used_blocks=len(s.stored),
            nixl_metadata=self.transport.metadata(), kv_base_addr=self.transport.base_addr,
            kv_block_bytes=self.transport.block_bytes, epoch=self.epoch, compat_hash=self.compat,
            kv_mem_type=self.transport.mem_type, num_handoffs=len(s.reservations),
        )

    async def Lookup(self, request, context) -> kvstore_pb2.LookupResponse:  # noqa: N802
        span = tracing.start_span("kvstore.get", tracing.incoming(context), blocks=len(request.block_hashes))
        slots = self.store.lookup(list(request.block_hashes), (request.pin_ms or 10_000) / 1000)
        span.set_attribute("pdmesh.hit_blocks", len(slots))
        span.end()
        return kvstore_pb2.LookupResponse(slot_ids=slots)

    async def Reserve(self, request, context) -> kvstore_pb2.StoreReserveResponse:  # noqa: N802
        span = tracing.start_span("kvstore.put", tracing.incoming(context), blocks=len(request.block_hashes))
        rid, slots = self.store.reserve(list(request.block_hashes))
        span.set_attribute("pdmesh.new_blocks", sum(1 for s in slots if s >= 0))
        span.end()
        return kvstore_pb2.StoreReserveResponse(slot_ids=slots, reservation_id=rid)

    async def Commit(self, request, context) -> kvstore_pb2.CommitResponse:  # noqa: N802
        return kvstore_pb2.CommitResponse(committed=self.store.commit(request.reservation_id, request.ok))


async def progress_pump(servicer: KVStoreServicer) -> None:
    """Drive this agent's UCX progress: peers' WRITEs into and READs from our slots need it
    (there is no NIXL progress thread; it would spin a core). Fast while writes are pending."""
    while True:
        servicer.transport.take_notifs()
        await asyncio.sleep(0.0005 if servicer.store.reservations else 0.002)


async def serve_kvstore(cfg: KVStoreConfig) -> None:
    server, port, health = create_server(f"{cfg.host}:{cfg.port}", NAMES)
    servicer = KVStoreServicer(cfg, advertised(cfg.advertise_address, cfg.host, port))
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(servicer, server)
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(progress_pump(servicer))]
    if cfg.redis_url:
        from pdmesh.index.publisher import IndexPublisher

        publisher = IndexPublisher(cfg.redis_url, cfg.worker_id, servicer.epoch, servicer.address)
        tasks.append(asyncio.create_task(publisher.run(
            servicer.store.take_events, lambda: list(servicer.store.stored)
        )))
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: [
        ("gauge", "pdmesh_kvstore_blocks", "kvstore slots by state", len(servicer.store.stored), {"state": "stored"}),
        ("gauge", "pdmesh_kvstore_blocks", "kvstore slots by state", len(servicer.store.free), {"state": "free"}),
        ("gauge", "pdmesh_kvstore_reservations", "Offloads being written", len(servicer.store.reservations), {}),
        ("counter", "pdmesh_kvstore_evictions", "Blocks evicted (LRU)", servicer.store.evictions, {}),
    ]))
    await server.start()
    serve_metrics(registry, cfg.host, cfg.metrics_port, cfg.port_file)
    write_port_file(cfg.port_file, port)
    await set_serving(health, NAMES, True)
    print(f"pdmesh kvstore {cfg.worker_id} ready on {servicer.address} "
          f"({servicer.store.capacity} blocks)", flush=True)

    async def stop() -> None:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        servicer.transport.close()

    await serve_until_signal(server, health, NAMES, cfg.drain_grace_s, stop)
