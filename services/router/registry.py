"""The workers a router knows: health, load and compatibility from their ``Info``.

A worker is refused (and never routed to) when its block size, hash seed or algorithm
differ from the router's contract, when it serves another model, or when its KV layout
(compat hash) differs from the mesh's first accepted worker. The reason is logged once
and shown by ``MeshAdmin.ListWorkers``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from pdmesh.serving.clients import worker_stub
from pdmesh.v1 import worker_pb2
from services.router.config import RouterConfig

log = logging.getLogger(__name__)
_ROLE = {"prefill": worker_pb2.WORKER_ROLE_PREFILL, "decode": worker_pb2.WORKER_ROLE_DECODE}


@dataclass(eq=False)
class WorkerHandle:
    address: str
    role: str
    info: worker_pb2.WorkerInfo | None = None
    healthy: bool = False
    refused: str = ""
    in_flight: int = 0

    @property
    def worker_id(self) -> str:
        return self.info.worker_id if self.info is not None else self.address

    @property
    def load(self) -> int:
        """Requests in flight from this router, plus those queued on the worker."""
        return self.in_flight + (self.info.num_waiting if self.info is not None else 0)


class Registry:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.workers = [WorkerHandle(a, "prefill") for a in cfg.prefill] + [
            WorkerHandle(a, "decode") for a in cfg.decode
        ]
        self.mesh_compat: str | None = None

    def healthy(self, role: str) -> list[WorkerHandle]:
        return [w for w in self.workers if w.role == role and w.healthy]

    def mark_down(self, handle: WorkerHandle) -> None:
        handle.healthy = False

    async def refresh(self) -> None:
        await asyncio.gather(*(self._refresh(w) for w in self.workers))

    async def _refresh(self, w: WorkerHandle) -> None:
        try:
            info = await worker_stub(w.address).Info(worker_pb2.InfoRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            if w.healthy:
                log.warning("%s worker at %s stopped answering", w.role, w.address)
            w.healthy = False
            return
        w.info = info
        reason = self._refusal(w, info)
        if reason != w.refused and reason:
            log.error("refusing %s worker %s at %s: %s", w.role, info.worker_id, w.address, reason)
        w.refused = reason
        w.healthy = not reason

    def _refusal(self, w: WorkerHandle, info: worker_pb2.WorkerInfo) -> str:
        cfg = self.cfg
        checks = [
            (info.role == _ROLE[w.role], f"it is not a {w.role} worker"),
            (info.model == Path(cfg.model).name,
             f"it serves model {info.model!r}, the mesh serves {Path(cfg.model).name!r}"),
            (info.block_size == cfg.block_size,
             f"block_size {info.block_size} differs from the mesh's {cfg.block_size}"),
            (info.hash_seed == cfg.hash_seed,
             f"hash_seed {info.hash_seed} differs from the mesh's {cfg.hash_seed}"),
            (info.hash_algorithm == cfg.hash_algorithm,
             f"hash_algorithm {info.hash_algorithm!r} differs from the mesh's {cfg.hash_algorithm!r}"),
        ]
        for ok, why in checks:
            if not ok:
                return why
        if self.mesh_compat is None:
            self.mesh_compat = info.compat_hash
        if info.compat_hash != self.mesh_compat:
            return f"KV layout/dtype (compat {info.compat_hash}) differs from the mesh's ({self.mesh_compat})"
        return ""

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.cfg.info_interval_s)
