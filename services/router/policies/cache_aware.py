"""Send each prompt where its first token is expected soonest.

For every candidate prefill worker ``w`` the router estimates

    ttft(w) = queued_tokens(w) * c(w)                      the work already waiting there
            + (prompt - cached(w) - fetched(w)) * c(w)     what this prompt computes there
            + fetched(w) * f(w)                            what it fetches from the kvstore

where ``cached(w)`` is the prompt's leading tokens ``w`` holds (the Redis index, and this
router's recent routes for prefixes the index has not heard of yet), ``fetched(w)`` what the
kvstore tier holds beyond that, ``queued_tokens`` the uncached prompt tokens of requests in
flight there (this router's own, or what the worker reports when that is more: other
routers' work), and ``c`` / ``f`` the seconds per computed / fetched token each worker
measures and advertises. So a prompt follows its prefix until the wait behind the holder
costs more than recomputing elsewhere, and no request count or weight needs tuning: the
units are seconds. Estimates within ``tolerance`` of the fastest count as equal (measured
costs are noisy; this is consistent hashing with bounded load): among those, the worker
that holds most of the prompt wins, then rendezvous hashing of the prompt's first block,
so a prefix that misses everywhere again keeps going to one worker. A first block the
router has never seen has no such home: it goes where it starts soonest (``first_free``).
The model and the measurements behind its defaults are in docs/routing.md.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from services.router.policies.base import Decision, RouteContext
from services.router.policies.prefix_hash import rendezvous_pick, ring_pick
from services.router.worker_handle import WorkerHandle


class Estimate(NamedTuple):
    """A tuple, not a frozen dataclass, whose ``__init__`` is several times slower: a
    decision makes up to 64 of them."""

    worker: WorkerHandle
    seconds: float
    cached: int
    """Prompt tokens the worker holds."""
    fetched: int
    """Prompt tokens it would fetch from the kvstore."""


def first_free(misses: list[Estimate]) -> list[Estimate]:
    """Of workers within the tolerance that hold none of a never-seen prompt, those expected
    to start it first: the fewest queued tokens and, of equal queues, the one whose work in
    progress began earliest (idle workers all; the caller hashes among them). Hashing among
    all of them placed such misses at random, behind round robin's rotation on uniform
    traffic (docs/routing.md); a first sighting has no place to keep."""
    fewest = min(e.worker.queued_tokens for e in misses)
    shortest = [e for e in misses if e.worker.queued_tokens == fewest]
    if fewest == 0 or len(shortest) == 1:
        return shortest
    return [min(shortest, key=lambda e: e.worker.started_at if e.worker.pending_tokens else float("inf"))]


class CacheAwarePolicy:
    name = "cache_aware"

    def __init__(self, us_per_token: float, kvstore_ratio: float, tolerance: float,
                 sample: int = 32) -> None:
        self.sample = sample
        """Workers holding none of the prompt are compared all while there are at most
        twice this many, else this many chosen at random."""
        self.rng = random.Random()
        self.s_per_token = us_per_token * 1e-6
        """Assumed for a worker that has not measured its own cost yet, while none of the
        workers compared with it has either (see ``assumed_cost``)."""
        self.kvstore_ratio = kvstore_ratio
        """A fetched token's cost as a fraction of a computed one, until measured."""
        self.tolerance = tolerance
        """Estimates within this fraction of the fastest are equal."""

    def assumed_cost(self, workers: list[WorkerHandle]) -> float:
        """Seconds per token for a worker that has not measured yet: the mean of what the
        others measured. Peers are usually alike; priced at the configured default, a
        new worker could look several times cheaper than it is and take every miss
        until its first prefill."""
        measured = [w.info.prefill_us_per_token for w in workers
                    if w.info is not None and w.info.prefill_us_per_token > 0]
        return 1e-6 * sum(measured) / len(measured) if measured else self.s_per_token

    def costs(self, w: WorkerHandle, assumed: float) -> tuple[float, float]:
        """Seconds per computed and per fetched token on ``w``: measured, else assumed."""
        info = w.info
        compute = (info.prefill_us_per_token * 1e-6 if info is not None else 0.0) or assumed
        fetch = (info.kvstore_us_per_token * 1e-6 if info is not None else 0.0) or compute * self.kvstore_ratio
        return compute, fetch

    def estimates(self, compared: list[WorkerHandle], ctx: RouteContext) -> list[Estimate]:
        """``ttft(w)`` for each worker compared (the module's formula); what depends only on
        the prompt is worked out once, as a decision compares up to 64 workers."""
        assumed = self.assumed_cost(compared)
        prompt = max(ctx.num_tokens, len(ctx.hashes) * ctx.block_size)
        tier = min(prompt, ctx.kvstore_blocks * ctx.block_size)
        matched = ctx.matched or {}
        out = []
        for w in compared:
            cached = min(prompt, matched.get(w.worker_id, 0) * ctx.block_size)
            fetched = max(0, tier - cached)
            compute, fetch = self.costs(w, assumed)
            seconds = (w.queued_tokens + prompt - cached - fetched) * compute + fetched * fetch
            out.append(Estimate(w, seconds, cached, fetched))
        return out

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        if ctx.matched is None:
            return Decision(ring_pick(candidates, ctx.routing_key), "index_down")
        matched = ctx.matched
        holders = ctx.holders if ctx.holders is not None else (
            [w for w in candidates if w.worker_id in matched] if matched else [])
        pool = candidates
        if len(candidates) > 2 * self.sample:
            # Among many workers that all lack the prompt, the fastest of a random sample
            # is nearly as good as the fastest of all ("power of d choices") and keeps a
            # decision cheap at 1,000 workers (docs/routing.md).
            # Drawn with replacement, repeats dropped: about a third of random.sample's
            # cost (scripts/probes/routing/route_decision_parts.py), and a sample of 31 or 32 compares
            # as well as one of 32.
            # Holders count toward the sample (a popular prefix has many), down to a
            # quarter of it drawn from the others, for a worker idler than every holder.
            k = max(self.sample // 4, self.sample - len(holders))
            pool = list(dict.fromkeys(self.rng.choices(candidates, k=k)))
        held = {id(w) for w in holders}
        compared = holders + [w for w in pool if id(w) not in held]
        estimates = self.estimates(compared, ctx)
        fastest = min(e.seconds for e in estimates)
        near = [e for e in estimates if e.seconds <= fastest * (1 + self.tolerance) + 1e-12]
        # Keep the prompt where most of it already is: locally cached, then fetchable.
        most = max((e.cached + e.fetched, e.cached) for e in near)
        tied = [e for e in near if (e.cached + e.fetched, e.cached) == most]
        if most == (0, 0) and not ctx.recurring and len(tied) > 1:
            tied = first_free(tied)
        best = tied[0]
        if len(tied) > 1:
            chosen = rendezvous_pick([e.worker for e in tied], ctx.routing_key)
            best = next(e for e in tied if e.worker is chosen)
        if best.cached:
            reason = "hit"
        elif holders:
            reason = "balance"  # sent away from a worker holding part of the prompt
        else:
            reason = "kvstore" if best.fetched else "miss"
        return Decision(best.worker, reason, best.cached + best.fetched)
