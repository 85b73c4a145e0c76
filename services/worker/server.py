"""Run a prefill or decode worker process: one server, one engine, background duties.

``create_server`` builds the bound server with the shared ``Worker`` service and the
role's own (``services/prefill/server.py``, ``services/decode/server.py`` say which);
``serve`` starts it, flips health to SERVING and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
import torch
from grpc_health.v1 import health

from pdmesh.rpc.process import cancel_all, freeze_startup_objects, write_port_file
from pdmesh.rpc.readiness import ReadinessGate
from pdmesh.rpc.server import create_server as create_grpc_server
from pdmesh.rpc.server import serve_until_signal, set_serving
from pdmesh.rpc.tls import TLSFiles
from pdmesh.startup import set_phase
from pdmesh.telemetry.metrics import serve_metrics
from services.worker import servicer
from services.worker.config import WorkerConfig
from services.worker.stats_log import log_stats, startup_summary
from services.worker.worker import Worker

log = logging.getLogger(__name__)
Background = Coroutine[Any, Any, None]
Attach = Callable[[grpc.aio.Server, Worker], list[Background]]
"""Adds a role's servicer to the server; returns the background loops it needs."""


@dataclass
class WorkerServer:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    worker: Worker
    names: list[str]
    """The gRPC services it serves (health reports each)."""
    attach: Attach
    gate: ReadinessGate
    """Refuses calls to ``names`` until the engine is loaded."""


def create_server(cfg: WorkerConfig, role_service: str, attach: Attach) -> WorkerServer:
    """The bound server with every servicer added (grpc.aio takes none after start) over a
    ``Worker`` whose engine is not built yet; ``serve`` loads it after the port opens."""
    names = [servicer.SERVICE, role_service]
    gate = ReadinessGate(names)
    server, port, health_servicer = create_grpc_server(f"{cfg.host}:{cfg.port}", names,
                                                       tls=TLSFiles.load(cfg.tls_cert, cfg.tls_key, cfg.tls_ca),
                                                       interceptors=[gate])
    worker = Worker(cfg, port)
    servicer.add_to_server(server, worker)
    return WorkerServer(server, health_servicer, worker, names, attach, gate)


async def serve(cfg: WorkerConfig, role_service: str, attach: Attach) -> None:
    """Open the port (health NOT_SERVING, calls refused with the start-up phase), load the
    model off the event loop, then serve: a startup probe sees the port from the start."""
    ws = create_server(cfg, role_service, attach)
    server, worker, names = ws.server, ws.worker, ws.names
    background_loops = ws.attach(server, worker)
    await server.start()
    write_port_file(cfg.port_file, worker.port)
    log.info("%s worker %s listening on %s; loading %s", cfg.role, worker.worker_id, worker.address, cfg.model)
    try:
        await asyncio.get_running_loop().run_in_executor(None, worker.load)
    except BaseException:  # the model did not load: say why, leaving nothing running
        for loop in background_loops:
            loop.close()
        await server.stop(0)
        raise
    tasks = [asyncio.create_task(b) for b in background_loops]
    serve_metrics(worker.metrics, cfg.host, cfg.metrics_port, cfg.port_file)
    log.debug("froze %d start-up objects out of the garbage collector's scans", freeze_startup_objects())
    ws.gate.open()
    set_phase("serving")
    await set_serving(ws.health, names, True)
    log.info("%s", startup_summary(cfg, worker))
    log.info("process: %d torch threads; %s; %s", torch.get_num_threads(),
             worker.engine.allocator.detail if worker.engine.allocator else "allocator: not tuned (not a CPU engine)",
             worker.engine.runner.kv_pages)
    print(f"pdmesh {cfg.role} {worker.worker_id} ready on {worker.address}", flush=True)
    tasks.append(asyncio.create_task(log_stats(worker)))

    leave = None
    if cfg.redis_url:
        from pdmesh.index.membership import Member, MemberAnnouncer

        announcer = MemberAnnouncer(cfg.redis_url, Member(cfg.role, worker.worker_id, worker.address, worker.epoch))
        tasks.append(asyncio.create_task(announcer.run()))

        async def leave() -> None:
            await announcer.leave()
            log.info("left the membership; serving %.1fs more before draining", cfg.leave_notice_s)
            await asyncio.sleep(cfg.leave_notice_s)

    async def stop_background() -> None:
        await cancel_all(tasks)
        await worker.async_engine.shutdown()
        worker.transfers.poller.close()

    await serve_until_signal(server, ws.health, names, cfg.drain_grace_s, stop_background,
                             before_drain=leave)
