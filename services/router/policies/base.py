"""The routing-policy protocol: pick one worker from healthy candidates, and say why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pdmesh.kv.block_hash import BlockHash
from services.router.worker_handle import WorkerHandle


@dataclass(frozen=True, slots=True)
class RouteContext:
    hashes: list[BlockHash]
    """The prompt's chained block hashes (full blocks only)."""
    routing_key: bytes
    """Stable key for consistent hashing (first block hash, or the prompt's first tokens)."""
    matched: dict[str, int] | None
    """worker id -> cached leading blocks from the index; None when the index is unreachable."""
    block_size: int
    kvstore_blocks: int = 0
    """Leading blocks the kvstore tier holds (fetchable by any prefill worker)."""
    num_tokens: int = 0
    """The prompt's length in tokens (what a worker holding none of it computes)."""
    holders: list[WorkerHandle] | None = None
    """The candidates named in ``matched``, when the caller found them already (None: the
    policy looks them up; a pass over 1,000 candidates costs ~0.1 ms)."""
    recurring: bool = True
    """Whether a prompt with this routing key came by before (``RecentRoutes.recurs``);
    False only for a key the router has never routed."""


@dataclass(frozen=True, slots=True)
class Decision:
    worker: WorkerHandle
    reason: str
    """Short label for metrics: "hit", "miss", "balance", "hash", "load", "rr" ..."""
    cached_tokens: int = 0
    """Prompt tokens the chosen worker is believed to cache."""


class Policy(Protocol):
    name: str

    def choose(self, candidates: list[WorkerHandle], ctx: RouteContext) -> Decision: ...
