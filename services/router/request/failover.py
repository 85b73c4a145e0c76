"""Which decode worker a request goes on with once its own failed it: a choice, made here
and applied by the request (``RequestState.leave_decode``), for its reserve, KV-write and
mid-stream failures alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from pdmesh.errors import UnavailableError

if TYPE_CHECKING:
    from pdmesh.kv.block_hash import BlockHash
    from services.router.request.mesh import RouterMesh
    from services.router.worker_handle import WorkerHandle


def replacement(mesh: RouterMesh, failed: WorkerHandle, exc: grpc.aio.AioRpcError, stage: str,
                hashes: list[BlockHash], exclude: set[str], tokens: int, held: int) -> tuple[WorkerHandle, int]:
    """Another healthy decode worker for a request ``failed`` broke (not in ``exclude``, the
    ones that failed it already) and the prompt tokens it was sent before; ``failed`` itself
    again before the stream starts when it is the only one and not known to be dead (its
    reservation was given back). UNAVAILABLE when none is left; RESOURCE_EXHAUSTED, with its
    retry hint, when every decode worker is full."""
    try:
        return mesh.route_decode(hashes, exclude=exclude, tokens=tokens)
    except UnavailableError:
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise exc from None  # every decode worker is full: "not now", with its retry hint
        if not failed.healthy or stage == "mid-stream":  # mid-stream it may still run there
            raise
        return failed, held
