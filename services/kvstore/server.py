"""Run the kvstore process: the pool, its gRPC service, UCX progress and index publishing."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health
from prometheus_client import CollectorRegistry

from pdmesh.rpc.process import advertised, cancel_all, freeze_startup_objects, write_port_file
from pdmesh.rpc.server import create_server as create_grpc_server
from pdmesh.rpc.server import serve_until_signal, set_serving
from pdmesh.rpc.tls import TLSFiles
from pdmesh.telemetry.metrics import SnapshotCollector, serve_metrics
from services.kvstore import servicer
from services.kvstore.config import KVStoreConfig
from services.kvstore.pace import ProgressPace, progress_pump
from services.kvstore.pool import StorePool

NAMES = [servicer.SERVICE]


def _registry(pool: StorePool) -> CollectorRegistry:
    registry = CollectorRegistry()
    store, slots = pool.store, "kvstore slots by state"
    registry.register(SnapshotCollector(lambda: [
        ("gauge", "pdmesh_kvstore_blocks", slots, len(store.stored), {"state": "stored"}),
        ("gauge", "pdmesh_kvstore_blocks", slots, len(store.free), {"state": "free"}),
        ("gauge", "pdmesh_kvstore_reservations", "Offloads being written", len(store.reservations), {}),
        ("counter", "pdmesh_kvstore_evictions", "Blocks evicted (LRU)", store.evictions, {}),
    ]))
    return registry


def create_server(cfg: KVStoreConfig) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer, StorePool,
                                               ProgressPace]:
    server, port, health_servicer = create_grpc_server(f"{cfg.host}:{cfg.port}", NAMES,
                                                       tls=TLSFiles.load(cfg.tls_cert, cfg.tls_key, cfg.tls_ca))
    pool = StorePool(cfg)
    pace = ProgressPace()
    servicer.add_to_server(server, pool, pace)
    return server, port, health_servicer, pool, pace


async def serve(cfg: KVStoreConfig) -> None:
    server, port, health_servicer, pool, pace = create_server(cfg)
    address = advertised(cfg.advertise_address, cfg.host, port)
    tasks = [asyncio.create_task(progress_pump(pool, pace))]
    if cfg.redis_url:
        from pdmesh.index.publisher import IndexPublisher

        publisher = IndexPublisher(cfg.redis_url, cfg.worker_id, pool.epoch, address)
        tasks.append(asyncio.create_task(publisher.run(pool.store.take_events, lambda: list(pool.store.stored))))
    await server.start()
    serve_metrics(_registry(pool), cfg.host, cfg.metrics_port, cfg.port_file)
    freeze_startup_objects()
    write_port_file(cfg.port_file, port)
    await set_serving(health_servicer, NAMES, True)
    print(f"pdmesh kvstore {cfg.worker_id} ready on {address} ({pool.store.capacity} blocks, {pool.pages})",
          flush=True)

    async def stop() -> None:
        await cancel_all(tasks)
        pool.close()

    await serve_until_signal(server, health_servicer, NAMES, cfg.drain_grace_s, stop)
