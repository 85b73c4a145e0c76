"""Workers that split one machine's cores lend them to each other while idle.

``pdmesh up`` on one machine gives each worker an equal share of the cores; a disaggregated
mesh then leaves a share idle whenever the load is mostly one phase: during a burst of
prompts the decode worker waits for KV, and once they are prefilled the prefill worker
waits for the next request. Measured on 2 cores (1 prefill + 1 decode, 32 x 256 + 32):
the mesh made 0.58-0.60x the output tokens of one engine using both cores
(docs/performance/log.md §11).

A ``CoreShare`` is one slot in a small file every worker of the machine maps (the
launcher creates it and names each worker's slot): per slot a busy byte and the worker's
share of cores. Before each step the engine thread marks itself busy and takes its own
share plus the shares of workers whose slot says idle, as far as busy workers' shares
leave cores free (with more workers than cores, every share is one core and they add up
to more than the machine); after 100 ms without work
(``LEND_AFTER_IDLE_S`` in the async engine) it marks itself idle, so the short gaps of a
stream of small requests lend nothing.
A worker that wakes up while a peer runs a step on lent cores waits for that step to end
(each slot's third byte says "running a step on borrowed cores"), at most
``RECLAIM_WAIT_S``: the two used to overlap for the peer's step, both on more threads
than cores, and such a step of a 576-token prompt ran at 1,040 us a token against
420-450 us on one thread (docs/performance/log.md §16). Single-byte stores and loads need
no lock; a worker that died busy only stops lending, one that died idle is lent until a
restart takes its slot again, and one that died borrowing is waited for once, for
``RECLAIM_WAIT_S``, then ignored until its borrowing mark changes.
"""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
SLOT_BYTES = 3
"""busy flag, share of cores, borrowing mark (0, or a step number 1-255 while a step on
more than the share is running)."""
RECLAIM_WAIT_S = 2.0
"""The longest a waking worker waits for a peer's step on its lent cores to end."""
_POLL_S = 0.0005
MIN_PROMPT_BUDGET = 256
"""The smallest prompt budget a step on a share of the cores gets, so that a machine split
many ways still prefills in chunks of a few hundred rows per product (not tuned: on 2 cores
split two or three ways the budget is 1,024)."""


def create_share_file(path: Path, workers: int) -> None:
    """A zeroed file of ``workers`` slots (every worker idle, no share published yet)."""
    path.write_bytes(bytes(SLOT_BYTES * workers))


def parse_spec(spec: str) -> tuple[Path, int]:
    """``PATH:SLOT`` as the worker's ``--core-share`` flag gives it."""
    path, sep, slot = spec.rpartition(":")
    if not sep or not path or not slot.isdigit():
        raise ValueError(f"--core-share wants PATH:SLOT, got {spec!r}")
    return Path(path), int(slot)


class CoreShare:
    def __init__(self, path: Path, slot: int, share: int, total: int,
                 set_threads: Callable[[int], None] | None = None) -> None:
        """``set_threads``: how to resize the engine's thread pool (torch's by default),
        called from the engine thread between steps."""
        if not 1 <= share <= min(total, 255):
            raise ValueError(f"a share of {share} cores does not fit a machine of {total}")
        self.slot = slot
        self.share = share
        self.total = total
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        if (slot + 1) * SLOT_BYTES > len(self._map):
            raise ValueError(f"slot {slot} is outside {path} ({len(self._map) // SLOT_BYTES} slots)")
        self._at = slot * SLOT_BYTES
        self._map[self._at] = 0
        self._map[self._at + 1] = share
        self._map[self._at + 2] = 0
        self._stuck: dict[int, int] = {}
        """Peer slot -> borrowing mark that outlasted a whole wait: not waited for again
        while the mark stays the same."""
        self.threads = share
        """Threads the engine was last given."""
        self._set_threads = set_threads or _torch_threads
        self.lent_steps = 0
        """Steps this worker ran on cores its peers lent it (``pdmesh_borrowed_core_steps``)."""

    def _lendable_cores(self) -> int:
        """Cores this worker may borrow: its idle peers' shares, but no more than the
        machine has beyond the shares of every busy worker (this one included). With more
        workers than cores the shares add up to more than the machine: 2 prefill + 2
        decode on 2 cores, one core each, three busy and one idle, and the idle one's core
        lent on top made three busy workers run four threads on two cores, a two-thread
        step waiting at each barrier for a thread that had no core (docs/performance/log.md
        §33)."""
        data = self._map[:]
        idle = busy = 0
        for at in range(0, len(data), SLOT_BYTES):
            if at == self._at:
                continue
            if data[at]:
                busy += data[at + 1]
            else:
                idle += data[at + 1]
        return max(0, min(idle, self.total - self.share - busy))

    def _borrowing_peers(self) -> dict[int, int]:
        """Peer slot -> borrowing mark, for peers running a step on lent cores now."""
        data = self._map[:]
        return {at: data[at + 2] for at in range(0, len(data), SLOT_BYTES)
                if at != self._at and data[at + 2] and self._stuck.get(at) != data[at + 2]}

    def busy(self, wait_s: float = RECLAIM_WAIT_S) -> int:
        """Mark this worker busy, wait (at most ``wait_s``) for any peer's step on lent
        cores to end, and return the threads this worker's next step should use."""
        self._map[self._at] = 1
        deadline = time.monotonic() + wait_s
        while (peers := self._borrowing_peers()) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        self._stuck.update(peers)  # the same step after a whole wait: do not wait for it again
        threads = min(self.total, self.share + self._lendable_cores())
        if threads > self.share:
            self.lent_steps += 1
        self._map[self._at + 2] = self.lent_steps % 255 + 1 if threads > self.share else 0
        self._apply(threads)
        return threads

    def prompt_budget(self, threads: int, max_tokens: int) -> int | None:
        """The prompt tokens a step on ``threads`` of the machine's cores may take: its
        share of ``max_tokens`` (None: all of them). A step keeps the threads it started
        with, so a 2,048-token prompt step begun on one of two cores while a peer was busy
        (~0.75 s on one core of our machines, from the 47 ms a 256-token prompt takes on
        two) ran on one core long after the peer went idle; a step sized to its cores
        lasts about as long as a full one, and the next step takes the lent cores
        (docs/performance/log.md §18)."""
        if threads >= self.total:
            return None
        return max(MIN_PROMPT_BUDGET, max_tokens * threads // self.total)

    def step_done(self) -> None:
        """The step ``busy`` sized has ended: peers waiting for their cores may start."""
        self._map[self._at + 2] = 0

    def idle(self) -> None:
        """Mark this worker idle (its cores are free for its peers) and shrink back."""
        self._map[self._at + 2] = 0
        self._map[self._at] = 0
        self._apply(self.share)

    def _apply(self, threads: int) -> None:
        if threads != self.threads:
            self._set_threads(threads)
            self.threads = threads

    @property
    def closed(self) -> bool:
        """Its slot was given back (the worker stopped)."""
        return self._map.closed

    def close(self) -> None:
        self._map[self._at + 2] = 0
        self._map[self._at] = 0
        self._map.close()


def _torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
