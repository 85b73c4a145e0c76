"""Fewest requests in flight (then most free KV blocks): the decode default."""

from __future__ import annotations

from services.router.policies.base import Decision, RouteContext
from services.router.worker_handle import WorkerHandle


class LeastLoadedPolicy:
    name = "least_loaded"

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        def key(w: WorkerHandle) -> tuple[int, int]:
            free = w.info.free_blocks if w.info is not None else 0
            return (w.load, -free)

        return Decision(min(candidates, key=key), "load")
