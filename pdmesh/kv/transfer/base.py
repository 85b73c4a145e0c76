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

    def metadata(self) -> bytes: ...

    def add_peer(self, peer: PeerLayout) -> None: ...

    def write(self, peer: str, src_blocks: list[int], dst_blocks: list[int], notif: bytes) -> object:
        """Start writing local blocks into the peer's blocks; returns a handle to poll."""
        ...

    def read(self, peer: str, local_blocks: list[int], remote_blocks: list[int]) -> object:
        """Start reading the peer's blocks into local blocks."""
        ...

    def notify(self, peer: str, message: bytes) -> None:
        """Send a notification without data."""
        ...

    def poll(self, handle: object) -> TransferState: ...

    def release(self, handle: object) -> None:
        """Forget a finished (or abandoned) transfer."""
        ...

    def take_notifs(self) -> list[bytes]:
        """Notifications received from peers since the last call."""
        ...

    def close(self) -> None: ...
