"""Decode on workers that share one machine's cores: fill one worker's batch before the next.

Spreading requests over decode workers is right when each has its own cores or GPU. When
they share the same cores (``pdmesh up`` on one machine), every decode worker reads all of
the model's weights each step for its own share of the batch, on the same cores: on 2
cores, 1 prefill + 2 decode workers made 0.70-0.82x the output of one worker on a burst of
32 x 256 + 64 (docs/performance/log.md §32). Packing keeps one batch as large as a single
worker's would be while the other worker idles and lends its cores.

The first worker in a stable order (worker id, so that every router packs onto the same
one) with fewer requests than its engine runs in one step (``WorkerInfo.max_num_seqs``)
gets the request; among workers with room, the one already holding most of the
conversation wins (``holder``: only its new tokens' KV is written). With every worker
full, the least loaded takes it, queueing there (``load``). A worker whose limit is not
known yet (no ``Info`` answered) is treated as full.
"""

from __future__ import annotations

from services.router.policies.base import Decision, RouteContext
from services.router.policies.holder import most_held
from services.router.policies.least_loaded import LeastLoadedPolicy
from services.router.worker_handle import WorkerHandle


def has_room(w: WorkerHandle) -> bool:
    """Fewer requests here than the worker's engine runs in one step."""
    return w.info is not None and w.load < w.info.max_num_seqs


class PackPolicy:
    name = "pack"

    def __init__(self) -> None:
        self._least = LeastLoadedPolicy()

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        room = [w for w in candidates if has_room(w)]
        if not room:
            return self._least.choose(candidates, ctx)
        held = ctx.matched or {}
        holders = [w for w in room if held.get(w.worker_id, 0) > 0]
        if holders:
            return most_held(holders, held, ctx.block_size)
        return Decision(min(room, key=lambda w: w.worker_id), "pack")
