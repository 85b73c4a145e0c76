"""Run a prefill or decode worker process: one server, one engine, background duties."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pdmesh.rpc.server import create_server, serve_until_signal, set_serving
from pdmesh.serving.worker_config import WorkerConfig
from pdmesh.serving.worker_core import WorkerCore, write_port_file
from pdmesh.telemetry.metrics import serve_metrics
from pdmesh.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)


class WorkerInfoServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, core: WorkerCore) -> None:
        self.core = core

    async def Info(self, request: worker_pb2.InfoRequest, context) -> worker_pb2.WorkerInfo:  # noqa: N802
        return self.core.aeng.call(self.core.info)


async def serve_worker(cfg: WorkerConfig) -> None:
    from services.decode.servicer import DecodeServicer
    from services.prefill.servicer import PrefillServicer

    role_service = "pdmesh.v1.Prefill" if cfg.role == "prefill" else "pdmesh.v1.Decode"
    names = ["pdmesh.v1.Worker", role_service]
    server, port, health = create_server(f"{cfg.host}:{cfg.port}", names)
    core = WorkerCore(cfg, port)
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerInfoServicer(core), server)
    tasks: list[asyncio.Task[None]] = []
    if cfg.role == "prefill":
        worker_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(core), server)
        if cfg.redis_url:
            from pdmesh.index.publisher import IndexPublisher

            publisher = IndexPublisher(cfg.redis_url, core.worker_id, core.epoch, core.address)
            tasks.append(asyncio.create_task(publisher.run(
                lambda: core.aeng.call(core.engine.pool.take_events),
                lambda: core.aeng.call(lambda: list(core.engine.pool.cached)),
            )))
    else:
        decode = DecodeServicer(core)
        worker_pb2_grpc.add_DecodeServicer_to_server(decode, server)
        tasks.append(asyncio.create_task(decode.reap_leases()))
        tasks.append(asyncio.create_task(decode.watch_notifications()))
    await server.start()
    serve_metrics(core.registry, cfg.host, cfg.metrics_port, cfg.port_file)
    write_port_file(cfg.port_file, port)
    await set_serving(health, names, True)
    log.info("%s worker %s serving on %s", cfg.role, core.worker_id, core.address)
    print(f"pdmesh {cfg.role} {core.worker_id} ready on {core.address}", flush=True)

    async def stop_background() -> None:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await core.aeng.shutdown()

    await serve_until_signal(server, health, names, cfg.drain_grace_s, stop_background)
