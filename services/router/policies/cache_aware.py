"""Longest cached prefix versus load, with an imbalance guard.

score(w) = cache_weight * max(cached_tokens(w), kvstore_weight * kvstore_tokens)
           - load_weight * load(w), where load counts the
router's own in-flight requests at decision time (so a burst cannot pile onto the one
worker that holds a hot prefix) plus the worker's queue. When loads differ by more than
``balance_threshold`` the least loaded worker wins outright. Ties go to the consistent-hash
choice, so equal candidates still keep prefixes together.
"""

from __future__ import annotations

from services.router.policies.base import Decision, RouteContext
from services.router.policies.prefix_hash import ring_pick
from services.router.registry import WorkerHandle


class CacheAwarePolicy:
    name = "cache_aware"

    def __init__(self, cache_weight: float, load_weight: float, balance_threshold: int,
                 kvstore_weight: float = 0.8) -> None:
        self.cache_weight = cache_weight
        self.kvstore_weight = kvstore_weight
        self.load_weight = load_weight
        self.balance_threshold = balance_threshold

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        if ctx.matched is None:
            return Decision(ring_pick(candidates, ctx.routing_key), "index_down")
        loads = [w.load for w in candidates]
        if max(loads) - min(loads) > self.balance_threshold:
            best = min(candidates, key=lambda w: w.load)
            return Decision(best, "balance", ctx.matched.get(best.worker_id, 0) * ctx.block_size)
        preferred = ring_pick(candidates, ctx.routing_key)
        tier = self.kvstore_weight * ctx.kvstore_blocks * ctx.block_size

        def score(w: WorkerHandle) -> tuple[float, bool]:
            cached = ctx.matched.get(w.worker_id, 0) * ctx.block_size  # type: ignore[union-attr]
            return (self.cache_weight * max(cached, tier) - self.load_weight * w.load, w is preferred)

        best = max(candidates, key=score)
        cached = ctx.matched.get(best.worker_id, 0) * ctx.block_size
        reason = "hit" if cached else "kvstore" if ctx.kvstore_blocks else "miss"
        return Decision(best, reason, max(cached, ctx.kvstore_blocks * ctx.block_size))
