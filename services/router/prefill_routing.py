"""The prefill decision: what each candidate holds (index + recent routes), then the policy.

Kept apart from ``Router`` (tokenizing, tracing, counters) so the routing simulator
(``pdmesh bench route-sim``) runs exactly this code, against a real Redis, on a virtual
clock.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pdmesh.index import keys
from pdmesh.index.mirrored_index import MirroredIndex
from pdmesh.kv.block_hash import BlockHash
from services.router.policies import Decision, Policy, RouteContext
from services.router.recent import RecentRoutes
from services.router.worker_handle import WorkerHandle

log = logging.getLogger(__name__)
TIER_PREFIX = "kvstore"
"""Index members whose worker id starts so are kvstore tiers, not prefill workers."""


@dataclass(frozen=True)
class IndexSeen:
    """What one prefill decision saw of the prompt's holders."""

    matched: dict[str, int] | None = None
    """Leading cached blocks per candidate holding any (None: the index is down)."""
    tier: int = 0
    """Leading blocks in the kvstore tier."""
    holders: list[WorkerHandle] = field(default_factory=list)
    """The candidates in ``matched``."""
    outside: dict[str, int] | None = None
    """Leading blocks per index member that is not a candidate (the kvstore, prefill workers
    not eligible now), the most over its epochs; None when the index was not read. The
    chosen prefill worker takes its kvstore's count from it instead of asking the kvstore
    (``PrefillRequest.index_view``)."""


class PrefillRouter:
    def __init__(self, policy: Policy, index: Any, block_size: int,
                 clock: Callable[[], float] = time.monotonic, max_holders: int = 32) -> None:
        self.policy = policy
        self.index = index
        """``MirroredIndex`` (the router's copy, Redis while it is not current), ``PrefixIndex``
        (Redis per lookup), or None (consistent hashing only)."""
        self.block_size = block_size
        self.clock = clock
        self.recent = RecentRoutes(clock=clock)
        self.index_failing_since: float | None = None
        """When lookups started failing (None while they succeed)."""
        self.index_fallbacks = 0
        """Lookups that found Redis unreachable (consistent hashing used)."""
        self.index_timeouts = 0
        """Lookups that timed out (Redis slow, not down)."""
        self.last_lookup_s = 0.0
        """Wall seconds the latest index lookup took (the Redis trip and its script)."""
        self.last_members = 0
        """Index members the latest lookup named (before ``select_members``)."""
        self.by_id = CandidateMap(clock=clock)
        self.max_holders = max_holders
        """Index members a decision weighs as holders, deepest first (``select_members``)."""
        self.rng = random.Random()

    async def choose(self, hashes: list[BlockHash], key: bytes, num_tokens: int,
                     candidates: list[WorkerHandle], remember: bool = True,
                     ) -> tuple[Decision, IndexSeen]:
        """The policy's decision, and what it saw. With ``remember``, the chosen worker is
        remembered as holding the prompt's blocks until the index says so itself; a caller
        that may still prefill elsewhere remembers once it knows (``recent.remember``)."""
        seen = await self.matched(hashes, candidates)
        ctx = RouteContext(hashes, key, seen.matched, self.block_size, seen.tier, num_tokens, seen.holders,
                           recurring=self.recent.recurs(key))
        decision = self.policy.choose(candidates, ctx)
        if remember:
            self.recent.remember(hashes, decision.worker.worker_id)
        return decision, seen

    async def matched(self, hashes: list[BlockHash], candidates: list[WorkerHandle]) -> IndexSeen:
        """Leading cached blocks per live prefill worker, in the kvstore tier, and the
        candidates holding any (the policy's holders, found here in the one pass over the
        candidates a decision makes, and only when someone holds the prompt: at 1,000
        workers each pass costs ~0.1 ms)."""
        if self.index is None:
            return IndexSeen()
        began = time.perf_counter()
        try:
            groups = await self.index.holders_by_depth(hashes)
            self.index_failing_since = None
        except (RedisError, OSError) as exc:
            # Only an unreachable Redis is "down" (consistent hashing); a slow answer under
            # load is counted apart and routes on what the router itself remembers.
            if (self.index_fallbacks + self.index_timeouts) % 100 == 0:
                log.warning("prefix index lookup failed (%s)", exc)
            if isinstance(exc, RedisTimeoutError | TimeoutError):
                self.index_timeouts += 1
                held = self.by_id.holding(candidates, {}, self.recent.depths(hashes))
                return IndexSeen({w.worker_id: n for w, n in held.items()}, 0, list(held))
            self.index_fallbacks += 1
            if self.index_failing_since is None:
                self.index_failing_since = self.clock()
            return IndexSeen()
        finally:
            self.last_lookup_s = time.perf_counter() - began
        self.last_members = sum(len(members) for _, members in groups)
        found = select_members(groups, self.max_holders, self.rng)
        tier = 0
        indexed: dict[str, dict[str, int]] = {}
        for (wid, epoch), n in found.items():
            if wid.startswith(TIER_PREFIX):
                tier = max(tier, n)
            else:  # a restarted worker can be listed under its old epoch and its new one
                indexed.setdefault(wid, {})[epoch] = n
        holding = self.by_id.holding(candidates, indexed, self.recent.depths(hashes))
        matched = {w.worker_id: n for w, n in holding.items()}
        outside: dict[str, int] = {}
        for (wid, _), n in found.items():  # the prompt's holders only: no pass over the candidates
            if wid not in matched:
                outside[wid] = max(n, outside.get(wid, 0))
        return IndexSeen(matched, tier, list(holding), outside)

    def health(self) -> str:
        if self.index is None:
            return "none"
        if self.index_failing_since is None:
            if not isinstance(self.index, MirroredIndex):
                return "ok"
            if self.index.mirror.usable():
                return f"ok, mirrored ({len(self.index.mirror)} blocks)"
            return "ok, asking Redis until the router's mirror is current"
        return (f"unreachable for {self.clock() - self.index_failing_since:.0f} s "
                f"({self.index_fallbacks} lookups fell back to consistent hashing)")


def select_members(groups: list[tuple[int, list[str]]], limit: int,
                   rng: random.Random) -> dict[tuple[str, str], int]:
    """``{(worker_id, epoch): depth}`` for every kvstore tier member and at most about
    ``limit`` others, deepest first, a random share of the group where the limit falls.

    A prefix every worker holds (a shared system prompt) lists them all; weighing each
    cost the decision 3.8 ms of Python at 1,000 holders (``scripts/probes/routing/route_decisions.py
    --holders=1000`` before this), and among many
    holding the same depth a random few find one nearly as idle as the idlest of all
    (as ``CacheAwarePolicy`` samples the workers that hold nothing). Holders deeper than
    the rest always count."""
    out: dict[tuple[str, str], int] = {}
    left = limit
    for depth, members in groups:
        if len(members) > left:
            tier = [m for m in members if m.startswith(TIER_PREFIX)]
            members = (rng.sample(members, left) if left > 0 else []) + tier
        left -= len(members)
        for m in members:
            out[keys.split_member(m)] = depth
    return out


class CandidateMap:
    """Worker id -> handles over the latest candidate list, so that finding a prompt's
    holders costs a lookup per holder instead of a pass over every candidate (5.5 us
    against a pass's ~85 at 1,000 workers: ``scripts/probes/routing/route_decision_parts.py``).
    Rebuilt when the list's members change (telling costs one identity comparison of two
    lists, a few us at 1,000) and at least every ``refresh_s``: a handle's id changes when
    an ``Info`` names it (its address until the first), which the list does not show."""

    def __init__(self, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self.clock = clock
        self._members: list[WorkerHandle] = []
        self._by_id: dict[str, list[tuple[int, WorkerHandle]]] = {}
        """Several handles can bear one id: a seed address that is a proxy, and the
        worker's own address learnt from the membership."""
        self._built_at = float("-inf")

    def holding(self, candidates: list[WorkerHandle], indexed: dict[str, dict[str, int]],
                recent: dict[str, int]) -> dict[WorkerHandle, int]:
        """The candidates holding leading blocks of the prompt, and how many, in the
        candidates' order: the index's count (``indexed``: worker id -> {epoch: blocks}),
        which counts only under the worker's current epoch (a restarted worker lost its
        cache), or the router's recent routes to it, whichever is more."""
        now = self.clock()
        if candidates != self._members or now - self._built_at >= self.refresh_s:  # by identity
            self._members = list(candidates)
            self._by_id = {}
            for i, w in enumerate(candidates):
                self._by_id.setdefault(w.worker_id, []).append((i, w))
            self._built_at = now
        found: list[tuple[int, WorkerHandle, int]] = []
        for wid in indexed.keys() | recent.keys():
            for i, w in self._by_id.get(wid, ()):
                if w.worker_id != wid:  # named otherwise since the map was built
                    continue
                n = indexed.get(wid, {}).get(w.info.epoch, 0) if w.info is not None else 0
                n = max(n, recent.get(wid, 0))
                if n:
                    found.append((i, w, n))
        found.sort(key=lambda f: f[0])
        return {w: n for _, w, n in found}
