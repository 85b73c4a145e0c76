"""A fault-injecting wrapper around a real ``KVTransport`` (tests only).

Some failures cannot be caused on demand from outside: "the prefill worker dies while its
KV write is in flight" needs the write to last long enough to kill the process. This
wrapper delays the start of every write by ``delay_s``; everything else goes to the real
NIXL transport. It is enabled only by ``PDMESH_FAULT_TRANSFER_DELAY_S``, read once when a
worker starts, and the worker logs a warning when it is on.
"""

from __future__ import annotations

import time

from pdmesh.kv.transfer.base import PeerLayout, TransferState


class DelayedWrites:
    def __init__(self, inner, delay_s: float) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.delay_s = delay_s

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    def add_peer(self, peer: PeerLayout) -> None:
        self.inner.add_peer(peer)

    def write(self, peer: str, src_blocks: list[int], dst_blocks: list[int]) -> object:
        return _Delayed(time.monotonic() + self.delay_s, (peer, src_blocks, dst_blocks))

    def read(self, peer: str, local_blocks: list[int], remote_blocks: list[int]) -> object:
        return self.inner.read(peer, local_blocks, remote_blocks)

    def poll(self, handle: object) -> TransferState:
        if isinstance(handle, _Delayed):
            if handle.inner is None:
                if time.monotonic() < handle.start_at:
                    return TransferState.PENDING
                handle.inner = self.inner.write(*handle.args)
            return self.inner.poll(handle.inner)
        return self.inner.poll(handle)

    def release(self, handle: object) -> None:
        if isinstance(handle, _Delayed):
            if handle.inner is not None:
                self.inner.release(handle.inner)
            return
        self.inner.release(handle)


class _Delayed:
    def __init__(self, start_at: float, args: tuple) -> None:  # type: ignore[type-arg]
        self.start_at = start_at
        self.args = args
        self.inner: object | None = None
