"""Run the router process."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pdmesh.rpc.server import create_server, serve_until_signal, set_serving
from pdmesh.serving.worker_core import write_port_file
from pdmesh.telemetry.metrics import serve_metrics
from pdmesh.v1 import admin_pb2_grpc, generate_pb2_grpc
from services.router.config import RouterConfig
from services.router.registry import Registry
from services.router.servicer import GenerationServicer, MeshAdminServicer, RouterCore

log = logging.getLogger(__name__)
NAMES = ["pdmesh.v1.Generation", "pdmesh.v1.MeshAdmin"]


async def serve_router(cfg: RouterConfig) -> None:
    server, port, health = create_server(f"{cfg.host}:{cfg.port}", NAMES)
    registry = Registry(cfg)
    index = None
    if cfg.redis_url:
        from pdmesh.index.lookup import PrefixIndex

        index = PrefixIndex(cfg.redis_url)
    core = RouterCore(cfg, registry, index)
    generate_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(core), server)
    admin_pb2_grpc.add_MeshAdminServicer_to_server(MeshAdminServicer(core), server)
    await registry.refresh()
    refresher = asyncio.create_task(registry.run())
    await server.start()
    serve_metrics(core.registry, cfg.host, cfg.metrics_port, cfg.port_file)
    write_port_file(cfg.port_file, port)
    await set_serving(health, NAMES, True)
    print(f"pdmesh router ready on {cfg.host}:{port}", flush=True)

    async def stop() -> None:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher

    await serve_until_signal(server, health, NAMES, cfg.drain_grace_s, stop)
