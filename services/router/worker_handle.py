"""One worker as a router sees it: what its last ``Info`` said, what this router has in
flight there, and the load, capacity and state derived from both (``registry.py`` keeps
the list and its health)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pdmesh.mesh_types import WorkerInfo
from services.router.stalls import StallWatch


@dataclass(eq=False)
class WorkerHandle:
    address: str
    role: str
    info: WorkerInfo | None = None
    healthy: bool = False
    refused: str = ""
    in_flight: int = 0
    """Requests this router has sent and not yet seen finish."""
    info_at: float = 0.0
    """When ``info`` was fetched (monotonic)."""
    released_at: float = 0.0
    """When one of this router's requests last finished here (monotonic)."""
    started_at: float = 0.0
    """When the work of ours now in progress here began, as far as this router can tell:
    a request's arrival at an idle worker, or the last finish (the next one began then).
    Of two workers with the same queue, the one that began earlier frees up first."""
    pending_tokens: int = 0
    """Uncached prompt tokens of this router's requests in flight here."""
    failures: int = 0
    """Info calls that failed in a row."""
    joined: bool = False
    """Added by the membership rather than a static list."""
    member: bool = False
    """Present in the membership at the last poll."""
    left: bool = False
    """Was a member and is no longer: it gets no new requests."""
    stalls: StallWatch = field(default_factory=StallWatch)
    """Its streams' recent gaps; a stall keeps new requests away (``stalls.py``)."""

    @property
    def worker_id(self) -> str:
        return self.info.worker_id if self.info is not None else self.address

    @property
    def load(self) -> int:
        """Requests in flight from this router, plus those queued on the worker.

        The queue length is dropped when ``info`` predates one of our own completions: the
        request it counted may be the one that just finished, and counting it would push
        the next request away from the worker that holds its prefix.
        """
        queued = self.info.num_waiting if self.info is not None and self.info_at > self.released_at else 0
        return self.in_flight + queued

    @property
    def state(self) -> str:
        """What ``MeshAdmin.ListWorkers`` and ``pdmesh status`` show."""
        if self.left:
            return "draining" if self.in_flight else "left"
        if self.refused:
            return "refused"
        if self.healthy:
            return "stalled" if self.stalls.stalled_at > float("-inf") else "serving"
        return "joining" if self.info is None and not self.failures else "down"

    @property
    def capacity(self) -> int:
        """The longest sequence it admits at all, in tokens: its context (``max_model_len``)
        and its KV pool (``num_blocks`` x ``block_size``), as the engine's own admission
        checks them (``Admission.check_fits``); 0 while its ``Info`` says neither (none
        yet, or an older worker's). Both are set per worker, and a prefill worker's pool
        is often smaller than a decode worker's."""
        info = self.info
        if info is None:
            return 0
        return min((n for n in (info.max_model_len, info.num_blocks * info.block_size) if n), default=0)

    def holds(self, tokens: int) -> bool:
        """It admits a sequence of ``tokens`` tokens; what its ``Info`` does not say does
        not rule it out (its own check answers)."""
        return not self.capacity or tokens <= self.capacity

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens waiting to be computed here: what this router sent and has not seen
        finish, or what the worker last reported when that is more (other routers' work),
        unless the report predates one of our completions (it may count that one)."""
        reported = (self.info.queued_prefill_tokens
                    if self.info is not None and self.info_at > self.released_at else 0)
        return max(self.pending_tokens, reported)

    def acquire(self, tokens: int = 0, now: float | None = None) -> None:
        """One more request of ours here, with ``tokens`` prompt tokens to compute (``now``:
        the caller's clock, monotonic unless a simulation passes its own)."""
        if self.in_flight == 0:
            self.started_at = time.monotonic() if now is None else now
        self.in_flight += 1
        self.pending_tokens += tokens

    def release(self, tokens: int = 0, now: float | None = None) -> None:
        self.in_flight -= 1
        self.pending_tokens -= tokens
        self.released_at = self.started_at = time.monotonic() if now is None else now

    @contextlib.contextmanager
    def counted(self, tokens: int = 0) -> Iterator[None]:
        """``acquire`` for the block, ``release`` however it ends."""
        self.acquire(tokens)
        try:
            yield
        finally:
            self.release(tokens)
