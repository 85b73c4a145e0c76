"""The decode worker's reservations: one record per request from ``Reserve`` until its
first token is committed (or the reservation is released or expires).

A record holds the transfer id (the request id and a nonce) and the lease expiry. Its KV
has landed when ``Decode`` arrives: the router calls it only after the prefill worker
answered, which that worker does only once its writes are DONE, i.e. in this worker's
memory (the kvstore's offload commit relies on the same order). The blocks themselves are
the engine's (a WAITING_FOR_REMOTE_KV sequence); this is only the RPC-side bookkeeping.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pdmesh.errors import UnknownRequestError
from pdmesh.rpc.process import now_ms
from services.decode.write_path import WritePath


@dataclass(slots=True)
class Reservation:
    request_id: str
    transfer_id: str
    """``{request_id}/{nonce}``: names this reservation, not an earlier one of the same
    request (released, then reserved again); ``Decode`` must carry it."""
    lease_expiry_ms: int
    """Unix ms after which the reservation is freed, unless ``Decode`` claimed it first."""


class Reservations:
    def __init__(self, writes: WritePath | None = None) -> None:
        self._by_request: dict[str, Reservation] = {}
        self.writes = writes or WritePath()
        """How KV has been landing here: whether awaiting it needs progress passes."""

    def __len__(self) -> int:
        return len(self._by_request)

    def add(self, request_id: str, lease_ms: int) -> Reservation:
        res = Reservation(request_id, f"{request_id}/{uuid.uuid4().hex[:8]}", now_ms() + lease_ms)
        self._by_request[request_id] = res
        return res

    def renew(self, request_id: str, lease_ms: int) -> Reservation:
        res = self._by_request.get(request_id)
        if res is None:
            raise UnknownRequestError(f"no reservation for {request_id} (expired or released)")
        res.lease_expiry_ms = now_ms() + lease_ms
        return res

    def claim(self, request_id: str, transfer_id: str) -> Reservation:
        """``Decode`` takes the reservation whose KV was written for ``transfer_id``: the
        record leaves this table (the lease reaper no longer sees it; the blocks are the
        engine's request's from here on)."""
        res = self._by_request.get(request_id)
        if res is None:
            raise UnknownRequestError(f"no reservation for {request_id} (expired, released or claimed)")
        if transfer_id != res.transfer_id:
            raise UnknownRequestError(
                f"the reservation of {request_id} for transfer {transfer_id!r} was released and "
                f"replaced (now {res.transfer_id!r}); its KV was written elsewhere"
            )
        return self._by_request.pop(request_id)

    def pop(self, request_id: str) -> Reservation | None:
        return self._by_request.pop(request_id, None)

    def expired(self) -> list[str]:
        """Reservations (all unclaimed) whose lease has ended."""
        now = now_ms()
        return [r.request_id for r in self._by_request.values() if r.lease_expiry_ms <= now]

    def awaiting_kv(self) -> bool:
        """Whether any reservation may still be written into (all are unclaimed) by a write
        that may need this worker's progress passes (``write_path.py``). Read from the
        transfer poller's thread: ``len`` of a dict is one atomic read."""
        return len(self._by_request) > 0 and self.writes.needs_passes()
