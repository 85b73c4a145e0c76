"""Run a decode worker: the shared worker runtime plus the ``Decode`` service, its lease
reaper and the UCX progress it drives for writes into its pool."""

from __future__ import annotations

import grpc

from services.decode import servicer
from services.worker.config import WorkerConfig
from services.worker.server import Background
from services.worker.server import serve as serve_worker
from services.worker.worker import Worker


def attach(server: grpc.aio.Server, worker: Worker) -> list[Background]:
    decode = servicer.add_to_server(server, worker)
    return [decode.reap_leases(), decode.drive_transfers()]


async def serve(cfg: WorkerConfig) -> None:
    await serve_worker(cfg, servicer.SERVICE, attach)
