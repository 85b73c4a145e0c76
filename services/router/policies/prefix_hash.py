"""Consistent hashing of the prompt's first block onto a ring of workers.

The same prefix always lands on the same worker while the set of workers is stable, and
only ~1/N of prefixes move when one joins or leaves. Also the fallback of ``cache_aware``
when the index is unreachable.
"""

from __future__ import annotations

import bisect
import functools

import xxhash

from services.router.policies.base import Decision, RouteContext
from services.router.worker_handle import WorkerHandle

_VNODES = 64


def _point(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


@functools.lru_cache(maxsize=16)
def _ring(worker_ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """The ring of a set of workers, built once per set (64 points each): at 1,000 workers
    building it per request would cost tens of milliseconds."""
    ring = sorted((_point(f"{wid}#{i}".encode()), wid) for wid in worker_ids for i in range(_VNODES))
    return [p for p, _ in ring], [wid for _, wid in ring]


def ring_pick(candidates: list[WorkerHandle], key: bytes) -> WorkerHandle:
    by_id = {w.worker_id: w for w in candidates}
    points, owners = _ring(tuple(sorted(by_id)))
    return by_id[owners[bisect.bisect(points, _point(key)) % len(points)]]


def rendezvous_pick(candidates: list[WorkerHandle], key: bytes) -> WorkerHandle:
    """The candidate whose hash with ``key`` is highest (rendezvous hashing): consistent
    like the ring, with no ring to build, so cheap for an ad-hoc set of tied candidates."""
    return max(candidates, key=lambda w: xxhash.xxh3_64_intdigest(key, _seed(w.worker_id)))


@functools.lru_cache(maxsize=65536)
def _seed(worker_id: str) -> int:
    return _point(worker_id.encode())


class PrefixHashPolicy:
    name = "prefix_hash"

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision:
        return Decision(ring_pick(candidates, ctx.routing_key), "hash")
