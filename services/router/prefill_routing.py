"""The prefill decision: what each candidate holds (index + recent routes), then the policy.

Kept apart from ``RouterCore`` (tokenizing, tracing, counters) so the routing simulator
(``pdmesh bench route-sim``) runs exactly this code, against a real Redis, on a virtual
clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pdmesh.kv.block_hash import BlockHash
from services.router.policies import Decision, Policy, RouteContext
from services.router.recent import RecentRoutes
from services.router.registry import WorkerHandle

log = logging.getLogger(__name__)


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
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.index = index
        """``PrefixIndex`` over Redis, or None (consistent hashing only)."""
        self.block_size = block_size
        self.clock = clock
        self.recent = RecentRoutes(clock=clock)
        self.index_failing_since: float | None = None
        """When lookups started failing (None while they succeed)."""
        self.index_fallbacks = 0
        """Lookups that found Redis unreachable (consistent hashing used)."""
        self.index_timeouts = 0
        self.last_lookup_s = 0.0
        """Wall seconds the latest index lookup took (the Redis trip and its script)."""
        """Lookups that timed out (Redis slow, not down)."""

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
            found = await self.index.longest_prefix(hashes)
            self.index_failing_since = None
        except (RedisError, OSError) as exc:
            # Only an unreachable Redis is "down" (consistent hashing); a slow answer under
            # load is counted apart and routes on what the router itself remembers.
            if (self.index_fallbacks + self.index_timeouts) % 100 == 0:
                log.warning("prefix index lookup failed (%s)", exc)
            if isinstance(exc, RedisTimeoutError | TimeoutError):
                self.index_timeouts += 1
                matched = _holding(candidates, {}, self.recent.depths(hashes))
                return IndexSeen({w.worker_id: n for w, n in matched.items()}, 0, list(matched))
            self.index_fallbacks += 1
            if self.index_failing_since is None:
                self.index_failing_since = self.clock()
            return IndexSeen()
        finally:
            self.last_lookup_s = time.perf_counter() - began
        tier = 0
        indexed: dict[str, dict[str, int]] = {}
        for (wid, epoch), n in found.items():
            if wid.startswith("kvstore"):
                tier = max(tier, n)
            else:  # a restarted worker can be listed under its old epoch and its new one
                indexed.setdefault(wid, {})[epoch] = n
        holding = _holding(candidates, indexed, self.recent.depths(hashes))
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
            return "ok"
        return (f"unreachable for {self.clock() - self.index_failing_since:.0f} s "
                f"({self.index_fallbacks} lookups fell back to consistent hashing)")


def _holding(candidates: list[WorkerHandle], indexed: dict[str, dict[str, int]],
             recent: dict[str, int]) -> dict[WorkerHandle, int]:
    """The candidates holding leading blocks of the prompt, and how many: the index's
    count (``indexed``: worker id -> {epoch: blocks}), which counts only under the worker's
    current epoch (a restarted worker lost its cache), or the router's recent routes to it,
    whichever is more. One pass over the candidates, none when nobody holds the prompt."""
    if not indexed and not recent:
        return {}
    wanted = indexed.keys() | recent.keys()
    out: dict[WorkerHandle, int] = {}
    for w in candidates:
        wid = w.worker_id
        if wid not in wanted:
            continue
        n = indexed.get(wid, {}).get(w.info.epoch, 0) if w.info is not None else 0
        n = max(n, recent.get(wid, 0))
        if n:
            out[w] = n
    return out
