"""The ``Worker`` service every prefill and decode worker serves: ``Info``."""

from __future__ import annotations

import grpc

from pdmesh.rpc.convert import info_to_proto
from pdmesh.v1 import worker_pb2, worker_pb2_grpc
from services.worker.worker import Worker

SERVICE = "pdmesh.v1.Worker"


class WorkerInfoServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def Info(self, request: worker_pb2.InfoRequest, context) -> worker_pb2.WorkerInfo:  # noqa: N802
        return info_to_proto(self.worker.async_engine.call(self.worker.info))


def add_to_server(server: grpc.aio.Server, worker: Worker) -> None:
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerInfoServicer(worker), server)
