"""The decode worker's reservations: one record per request from ``Reserve`` until its
first token is committed (or the reservation is released or expires).

A record holds the transfer id the prefill worker's NIXL notification will carry, the
lease expiry and an event set when that notification arrives. The blocks themselves are
the engine's (a WAITING_FOR_REMOTE_KV sequence); this is only the RPC-side bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field

from pdmesh.errors import TransferFailedError, UnknownRequestError
from pdmesh.rpc.process import now_ms


@dataclass(slots=True)
class Reservation:
    request_id: str
    transfer_id: str
    """``{request_id}/{nonce}``: the notification that says the KV has landed."""
    lease_expiry_ms: int
    """Unix ms after which an unclaimed reservation is freed (and a claimed one gives up)."""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    claimed: bool = False
    """``Decode`` has taken it: the lease reaper leaves it alone."""


class Reservations:
    def __init__(self) -> None:
        self._by_request: dict[str, Reservation] = {}
        self._by_transfer: dict[bytes, Reservation] = {}

    def __len__(self) -> int:
        return len(self._by_request)

    def add(self, request_id: str, lease_ms: int) -> Reservation:
        res = Reservation(request_id, f"{request_id}/{uuid.uuid4().hex[:8]}", now_ms() + lease_ms)
        self._by_request[request_id] = res
        self._by_transfer[res.transfer_id.encode()] = res
        return res

    def renew(self, request_id: str, lease_ms: int) -> Reservation:
        res = self._by_request.get(request_id)
        if res is None:
            raise UnknownRequestError(f"no reservation for {request_id} (expired or released)")
        res.lease_expiry_ms = now_ms() + lease_ms
        return res

    def claim(self, request_id: str) -> Reservation:
        res = self._by_request.get(request_id)
        if res is None or res.claimed:
            raise UnknownRequestError(f"no reservation for {request_id} (expired or released)")
        res.claimed = True
        return res

    def pop(self, request_id: str) -> Reservation | None:
        res = self._by_request.pop(request_id, None)
        if res is not None:
            self._by_transfer.pop(res.transfer_id.encode(), None)
        return res

    def expired(self) -> list[str]:
        """Unclaimed reservations whose lease has ended."""
        now = now_ms()
        return [r.request_id for r in self._by_request.values()
                if not r.claimed and r.lease_expiry_ms <= now]

    def awaiting_kv(self) -> bool:
        """Read from the transfer poller's thread: a copy, never the live dict."""
        return any(not r.arrived.is_set() for r in list(self._by_request.values()))

    def notified(self, transfer_ids: list[bytes]) -> None:
        """NIXL notifications arrived; ids of released reservations are ignored."""
        for tid in transfer_ids:
            res = self._by_transfer.get(tid)
            if res is not None:
                res.arrived.set()

    @staticmethod
    async def wait_for_kv(res: Reservation) -> None:
        """Until the KV has landed; ``TransferFailedError`` if the lease ends first (a
        renewal while waiting extends the wait)."""
        while not res.arrived.is_set():
            left = (res.lease_expiry_ms - now_ms()) / 1000
            if left <= 0:
                raise TransferFailedError(
                    f"the KV of {res.request_id} did not arrive before its lease ended"
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(res.arrived.wait(), timeout=min(left, 1.0))
