"""Consistent hashing of the prompt's first block onto a ring of workers.

The same prefix always lands on the same worker while the set of workers is stable, and
only ~1/N of prefixes move when one joins or leaves. Also the fallback of ``cache_aware``
when the index is unreachable.
"""

from __future__ import annotations

import bisect

import xxhash

from services.router.policies.base import Decision, RouteContext
from services.router.registry import WorkerHandle

_VNODES = 64


def _point(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def ring_pick(candidates: list[WorkerHandle], key: bytes) -> WorkerHandle:
    ring = sorted(
        (_point(f"{w.worker_id}#{i}".encode()), w) for w in candidates for i in range(_VNODES)
    )
    points = [p for p, _ in ring]
    at = bisect.bisect(points, _point(key)) % len(ring)
    return ring[at][1]


class PrefixHashPolicy:
    name = "prefix_hash"

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        return Decision(ring_pick(candidates, ctx.routing_key), "hash")
