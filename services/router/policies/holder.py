"""Decode: the worker that already holds the conversation, unless it is busier than the rest.

A decode worker keeps every prompt's blocks as prefix cache, so the worker that served a
conversation's earlier turns holds the leading blocks of its next prompt: reserving there,
only the new tokens' KV is written over NIXL (and a local prefill reuses the rest). The
router remembers which decode worker it sent each prompt's blocks to (``matched``: worker
id -> leading blocks it was sent); among holders with at most ``slack`` more requests than
the least loaded worker, the one holding most wins. Otherwise, and for a prompt nobody
holds, the least loaded worker (``LeastLoadedPolicy``).
"""

from __future__ import annotations

from services.router.policies.base import Decision, RouteContext
from services.router.policies.least_loaded import LeastLoadedPolicy
from services.router.worker_handle import WorkerHandle


def most_held(holders: list[WorkerHandle], held: dict[str, int], block_size: int) -> Decision:
    """The holder with most of the prompt's leading blocks, then the least loaded."""
    best = max(holders, key=lambda w: (held[w.worker_id], -w.load))
    return Decision(best, "holder", held[best.worker_id] * block_size)


class HolderPolicy:
    name = "holder"

    def __init__(self, slack: int) -> None:
        self.slack = slack
        self._least = LeastLoadedPolicy()

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        least = self._least.choose(candidates, ctx)
        held = ctx.matched or {}
        limit = least.worker.load + self.slack
        holders = [w for w in candidates if held.get(w.worker_id, 0) > 0 and w.load <= limit]
        return most_held(holders, held, ctx.block_size) if holders else least
