"""Each worker in turn: the baseline the other policies are measured against."""

from __future__ import annotations

import itertools

from services.router.policies.base import Decision, RouteContext
from services.router.worker_handle import WorkerHandle


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        ordered = sorted(candidates, key=lambda w: w.worker_id)
        return Decision(ordered[next(self._counter) % len(ordered)], "rr")
