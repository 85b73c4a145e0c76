"""Answer health from the moment the port opens, and nothing else until the model is in.

A worker binds and starts its server before it loads its model, so that a Kubernetes
startup probe (or ``pdmesh up``) finds the port open and health ``NOT_SERVING`` while the
weights load, instead of a closed port that a liveness probe restarts in a loop. Until
``open()``, every call to the worker's own services is refused ``UNAVAILABLE`` with the
start-up phase (``pdmesh/startup.py``), so no servicer ever runs against an engine that
is not built yet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from pdmesh.rpc.refusal import refusing
from pdmesh.startup import current_phase


class ReadinessGate(grpc.aio.ServerInterceptor):
    def __init__(self, services: Sequence[str]) -> None:
        self._prefixes = tuple(f"/{s}/" for s in services)
        self.ready = False

    def open(self) -> None:
        self.ready = True

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        if self.ready or not details.method.startswith(self._prefixes):
            return await continuation(details)
        phase, seconds = current_phase()
        return refusing(await continuation(details), grpc.StatusCode.UNAVAILABLE,
                        f"this worker is starting ({phase}, {seconds:.0f}s so far); it serves once its "
                        "health says SERVING")
