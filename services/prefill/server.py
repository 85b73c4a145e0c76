"""Run a prefill worker: the shared worker runtime plus the ``Prefill`` service and, with
a Redis URL, the publisher that tells the prefix index what this worker caches."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from services.prefill import servicer
from services.worker.config import WorkerConfig
from services.worker.server import Background
from services.worker.server import serve as serve_worker
from services.worker.worker import Worker


def attach(server: grpc.aio.Server, worker: Worker) -> list[Background]:
    servicer.add_to_server(server, worker)
    if not worker.cfg.redis_url:
        return []
    from pdmesh.index.publisher import IndexPublisher

    publisher = IndexPublisher(worker.cfg.redis_url, worker.worker_id, worker.epoch, worker.address)

    async def publish() -> None:
        loop, wake = asyncio.get_running_loop(), asyncio.Event()

        def first_event() -> None:  # on the engine thread, mid-step: never raise
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker is stopping
                loop.call_soon_threadsafe(wake.set)

        worker.engine.pool.on_first_event = first_event
        await publisher.run(lambda: worker.async_engine.call(worker.engine.pool.take_events),
                            lambda: worker.async_engine.call(lambda: list(worker.engine.pool.cached)), wake)

    return [publish()]


async def serve(cfg: WorkerConfig) -> None:
    await serve_worker(cfg, servicer.SERVICE, attach)
