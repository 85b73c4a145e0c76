"""The prefill worker's client of the kvstore: lookups, reservations and commits as plain
Python values (block hashes in, slot ids out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdmesh.mesh_types import WorkerInfo
from pdmesh.rpc.clients import fetch_info, kvstore_stub
from pdmesh.v1 import kvstore_pb2

Metadata = Sequence[tuple[str, str]] | None


@dataclass(frozen=True)
class KVStoreClient:
    address: str
    timeout: float = 2.0
    """Deadline of each control call (the data moves over NIXL)."""

    async def info(self) -> WorkerInfo:
        return await fetch_info(self.address, self.timeout, kvstore=True)

    async def lookup(self, hashes: Sequence[bytes], pin_ms: int, metadata: Metadata = None) -> list[int]:
        """Slots of the leading blocks of ``hashes`` the store holds, pinned for ``pin_ms``."""
        resp = await kvstore_stub(self.address).Lookup(
            kvstore_pb2.LookupRequest(block_hashes=hashes, pin_ms=pin_ms),
            metadata=metadata, timeout=self.timeout,
        )
        return list(resp.slot_ids)

    async def reserve(self, hashes: Sequence[bytes], metadata: Metadata = None) -> tuple[str, list[int]]:
        """``(reservation id, slot per hash)``; -1 where the store already holds the block."""
        resp = await kvstore_stub(self.address).Reserve(
            kvstore_pb2.StoreReserveRequest(block_hashes=hashes), metadata=metadata, timeout=self.timeout,
        )
        return resp.reservation_id, list(resp.slot_ids)

    async def commit(self, reservation_id: str, ok: bool, metadata: Metadata = None) -> None:
        await kvstore_stub(self.address).Commit(
            kvstore_pb2.CommitRequest(reservation_id=reservation_id, ok=ok),
            metadata=metadata, timeout=self.timeout,
        )
