"""Fault-injecting wrappers around a real ``KVTransport`` (tests only).

Some failures cannot be caused on demand from outside: "the prefill worker dies while its
KV write is in flight" needs the write to last long enough to kill the process, and "one
write fails while the peer stays healthy" needs a write that fails by itself. These
wrappers delay the start of every write by ``delay_s`` (``DelayedWrites``) or fail the
writes with the given ordinals (``FailingWrites``); everything else goes to the real NIXL
transport. They are enabled only by ``PDMESH_FAULT_TRANSFER_DELAY_S`` and
``PDMESH_FAULT_TRANSFER_FAIL`` (``fault_wrapped``), read once when a worker starts, and the
worker logs a warning when one is on.
"""

from __future__ import annotations

import logging
import os
import time

from pdmesh.kv.transfer.base import KVTransport, PeerLayout, TransferState

log = logging.getLogger(__name__)


def fault_wrapped(transport: KVTransport) -> KVTransport:
    """``transport`` inside the wrappers this process's environment asks for."""
    delay = os.environ.get("PDMESH_FAULT_TRANSFER_DELAY_S")
    if delay:
        log.warning("FAULT INJECTION: every KV write starts %ss late", delay)
        transport = DelayedWrites(transport, float(delay))
    failing = os.environ.get("PDMESH_FAULT_TRANSFER_FAIL")
    if failing:
        log.warning("FAULT INJECTION: KV writes number %s fail", failing)
        transport = FailingWrites(transport, {int(n) for n in failing.split(",")})
    return transport


class _Wrapper:
    def __init__(self, inner: KVTransport) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def add_peer(self, peer: PeerLayout) -> None:
        self.inner.add_peer(peer)

    def read(self, peer: str, local_blocks: list[int], remote_blocks: list[int]) -> object:
        return self.inner.read(peer, local_blocks, remote_blocks)


class DelayedWrites(_Wrapper):
    def __init__(self, inner: KVTransport, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s

    def write(self, peer: str, src_blocks: list[int], dst_blocks: list[int]) -> object:
        return _Delayed(time.monotonic() + self.delay_s, (peer, src_blocks, dst_blocks))

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
    def __init__(self, start_at: float, args: tuple) -> None:
        self.start_at = start_at
        self.args = args
        self.inner: object | None = None


class FailingWrites(_Wrapper):
    """The writes numbered in ``fail`` (1 = this worker's first write) report FAILED
    without moving a byte, as a write whose connection broke would; the others are real."""

    def __init__(self, inner: KVTransport, fail: set[int]) -> None:
        super().__init__(inner)
        self.fail = fail
        self.writes = 0

    def write(self, peer: str, src_blocks: list[int], dst_blocks: list[int]) -> object:
        self.writes += 1
        if self.writes in self.fail:
            return _FAILED
        return self.inner.write(peer, src_blocks, dst_blocks)

    def poll(self, handle: object) -> TransferState:
        return TransferState.FAILED if handle is _FAILED else self.inner.poll(handle)

    def release(self, handle: object) -> None:
        if handle is not _FAILED:
            self.inner.release(handle)


_FAILED = object()
"""The handle of a write ``FailingWrites`` failed."""
