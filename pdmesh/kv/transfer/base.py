"""The KV-transfer interface: start a write, poll it, abort it.

Ownership: the decode worker allocates the destination blocks (``Reserve``) and frees them
if the KV does not arrive before its lease ends; the prefill worker holds its source blocks
only until its write is DONE, ERR or past its deadline, and always frees them then.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class TransferState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class KVRegion:
    """A registered KV pool: ``num_blocks`` contiguous blocks of ``block_bytes`` from ``base_addr``.

    The memory belongs to the caller (a torch tensor on a worker, a numpy array in the
    kvstore) and must outlive the transport.
    """

    base_addr: int
    num_blocks: int
    block_bytes: int
    mem_type: str = "DRAM"
    """"DRAM" or "VRAM"."""
    device_id: int = 0

    @classmethod
    def of_tensor(cls, pool) -> KVRegion:
        """The region of a ``[num_blocks, ...]`` torch tensor (duck-typed: no torch import)."""
        cuda = bool(pool.is_cuda)
        return cls(pool.data_ptr(), pool.shape[0], pool[0].numel() * pool.element_size(),
                   "VRAM" if cuda else "DRAM", (pool.device.index or 0) if cuda else 0)


@dataclass(frozen=True, slots=True)
class PeerLayout:
    """What a sender needs to address a receiver's KV pool."""

    name: str
    """The receiver's NIXL agent name (its worker id)."""
    metadata: bytes
    base_addr: int
    block_bytes: int
    num_blocks: int
    mem_type: str = "DRAM"
    device_id: int = 0


class KVTransport(Protocol):
    """One per worker; every method is non-blocking."""

    name: str
    region: KVRegion
    """This worker's own registered pool."""
    block_bytes: int

    def metadata(self) -> bytes: ...

    def has_peer(self, name: str) -> bool: ...

    def add_peer(self, peer: PeerLayout) -> None: ...

    def remove_peer(self, name: str) -> None: ...

    def write(self, peer: str, src_blocks: list[int], dst_blocks: list[int]) -> object:
        """Start writing local blocks into the peer's blocks; returns a handle to poll. It
        polls DONE once the data is in the peer's memory; the peer learns of it from the
        RPC that follows (no NIXL notification: one holds the connection until the peer
        polls, and the next write waits behind it)."""
        ...

    def read(self, peer: str, local_blocks: list[int], remote_blocks: list[int]) -> object:
        """Start reading the peer's blocks into local blocks."""
        ...

    def poll(self, handle: object) -> TransferState: ...

    def release(self, handle: object) -> None:
        """Forget a finished (or abandoned) transfer."""
        ...

    def progress(self) -> None:
        """Drive this side's part of peers' transfers into or out of its pool: a target
        must progress for some (UCX over TCP moves a peer's WRITE only then, and a new
        peer's connection is set up only then)."""
        ...

    def close(self) -> None: ...
