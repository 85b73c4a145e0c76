"""Run a prefill worker: the shared worker runtime plus the ``Prefill`` service and, with
a Redis URL, the publisher that tells the prefix index what this worker caches."""

from __future__ import annotations

import grpc

from services.prefill import servicer
from services.worker.config import WorkerConfig
from services.worker.core import WorkerCore
from services.worker.server import Background
from services.worker.server import serve as serve_worker


def attach(server: grpc.aio.Server, core: WorkerCore) -> list[Background]:
    servicer.add_to_server(server, core)
    if not core.cfg.redis_url:
        return []
    from pdmesh.index.publisher import IndexPublisher

    publisher = IndexPublisher(core.cfg.redis_url, core.worker_id, core.epoch, core.address)
    return [publisher.run(
        lambda: core.aeng.call(core.engine.pool.take_events),
        lambda: core.aeng.call(lambda: list(core.engine.pool.cached)),
    )]


async def serve(cfg: WorkerConfig) -> None:
    await serve_worker(cfg, servicer.SERVICE, attach)
