"""Run the router process: its gRPC services, the worker registry refresh, /metrics."""

from __future__ import annotations

import asyncio
import os

import grpc
from grpc_health.v1 import health

from pdmesh.index.lookup import PrefixIndex
from pdmesh.index.mirrored_index import MirroredIndex
from pdmesh.rpc.auth import BearerTokenInterceptor
from pdmesh.rpc.process import (
    advertised,
    cancel_all,
    freeze_startup_objects,
    write_port_file,
)
from pdmesh.rpc.server import create_server as create_grpc_server
from pdmesh.rpc.server import serve_until_signal, set_serving
from pdmesh.rpc.tls import TLSFiles
from pdmesh.telemetry.metrics import serve_metrics
from services.router import servicer
from services.router.config import RouterConfig
from services.router.registry import Registry
from services.router.router import Router


def create_server(cfg: RouterConfig) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer, Router]:
    api_key = cfg.api_key or os.environ.get("PDMESH_API_KEY", "")
    guards = [BearerTokenInterceptor(api_key, servicer.SERVICES)] if api_key else []
    server, port, health_servicer = create_grpc_server(
        f"{cfg.host}:{cfg.port}", servicer.SERVICES, int(cfg.max_request_mb * 2**20),
        TLSFiles.load(cfg.tls_cert, cfg.tls_key, cfg.tls_ca), guards, cfg.require_client_cert,
    )
    index: PrefixIndex | MirroredIndex | None = None
    if cfg.redis_url:
        index = MirroredIndex(cfg.redis_url) if cfg.index_mirror else PrefixIndex(cfg.redis_url)
    router = Router(cfg, Registry(cfg), index)
    servicer.add_to_server(server, router)
    return server, port, health_servicer, router


async def serve(cfg: RouterConfig) -> None:
    server, port, health_servicer, router = create_server(cfg)
    await router.workers.refresh()
    background = [asyncio.create_task(router.workers.run())]
    if cfg.redis_url:
        background.append(asyncio.create_task(router.workers.watch_members(cfg.redis_url)))
    if isinstance(router.index, MirroredIndex):
        background.append(asyncio.create_task(router.index.run()))
    await server.start()
    http = None
    if cfg.http_port >= 0:
        from services.router.http.front import HTTPFront

        http = HTTPFront(router, cfg.host, cfg.http_port, cfg.api_key or os.environ.get("PDMESH_API_KEY", ""),
                         cfg.tls_cert, cfg.tls_key)
        try:
            http_port = await http.start()
        except BaseException:  # a taken --http-port: one line, and no server left for the loop's end
            await cancel_all(background)
            await server.stop(0)
            raise
        if cfg.port_file:
            write_port_file(cfg.port_file + ".http", http_port)
        scheme = "https" if cfg.tls_cert else "http"
        print(f"pdmesh router HTTP API on {scheme}://{cfg.host}:{http_port}", flush=True)
    serve_metrics(router.metrics, cfg.host, cfg.metrics_port, cfg.port_file)
    freeze_startup_objects()
    write_port_file(cfg.port_file, port)
    await set_serving(health_servicer, servicer.SERVICES, True)
    print(f"pdmesh router ready on {advertised(cfg.advertise_address, cfg.host, port)}", flush=True)

    async def stop() -> None:
        await cancel_all(background)
        await router.feeds.close()

    await serve_until_signal(server, health_servicer, servicer.SERVICES, cfg.drain_grace_s, stop,
                             http.stop if http is not None else None)
