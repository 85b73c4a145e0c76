"""Workers that split one machine's cores lend them to each other while idle.

``pdmesh up`` on one machine gives each worker an equal share of the cores; a disaggregated
mesh then leaves a share idle whenever the load is mostly one phase: during a burst of
prompts the decode worker waits for KV, and once they are prefilled the prefill worker
waits for the next request. Measured on 2 cores (1 prefill + 1 decode, 32 x 256 + 32):
the mesh made 0.58-0.60x the output tokens of one engine using both cores
(docs/performance.md §11).

A ``CoreShare`` is one slot in a small file every worker of the machine maps (the
launcher creates it and names each worker's slot): per slot a busy byte and the worker's
share of cores. Before each step the engine thread marks itself busy and takes its own
share plus the shares of workers whose slot says idle; after 100 ms without work
(``LEND_AFTER_IDLE_S`` in the async engine) it marks itself idle, so the short gaps of a
stream of small requests lend nothing.
A worker that wakes up while a peer still runs on its lent cores overlaps it for at most
that peer's one step, after which the peer shrinks back. Single-byte stores and loads
need no lock; a worker that died busy only stops lending, and one that died idle is
lent until a restart takes its slot again.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
SLOT_BYTES = 2
"""busy flag, share of cores."""


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
        self.threads = share
        """Threads the engine was last given."""
        self._set_threads = set_threads or _torch_threads
        self.lent_steps = 0
        """Steps this worker ran on cores its peers lent it (``pdmesh_borrowed_core_steps``)."""

    def _idle_peer_cores(self) -> int:
        data = self._map[:]
        lent = 0
        for at in range(0, len(data), SLOT_BYTES):
            if at != self._at and not data[at]:
                lent += data[at + 1]
        return lent

    def busy(self) -> int:
        """Mark this worker busy; the threads its next step should use."""
        self._map[self._at] = 1
        threads = min(self.total, self.share + self._idle_peer_cores())
        if threads > self.share:
            self.lent_steps += 1
        self._apply(threads)
        return threads

    def idle(self) -> None:
        """Mark this worker idle (its cores are free for its peers) and shrink back."""
        self._map[self._at] = 0
        self._apply(self.share)

    def _apply(self, threads: int) -> None:
        if threads != self.threads:
            self._set_threads(threads)
            self.threads = threads

    def close(self) -> None:
        self._map[self._at] = 0
        self._map.close()


def _torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
