import asyncio

import pytest

from pdmesh.errors import TransferFailedError, UnknownRequestError
from services.decode.reservations import Reservations


def test_one_record_from_reserve_to_claim() -> None:
    async def run() -> None:
        rs = Reservations()
        res = rs.add("r1", lease_ms=60_000)
        assert res.transfer_id.startswith("r1/") and len(rs) == 1 and rs.awaiting_kv()
        rs.notified([b"unknown/123", res.transfer_id.encode()])
        assert res.arrived.is_set() and not rs.awaiting_kv()
        assert rs.claim("r1") is res
        with pytest.raises(UnknownRequestError, match="expired or released"):
            rs.claim("r1")  # a second Decode for the same reservation
        await rs.wait_for_kv(res)
        assert rs.pop("r1") is res and len(rs) == 0

    asyncio.run(run())


def test_expiry_spares_claimed_records_and_renewal_extends() -> None:
    async def run() -> None:
        rs = Reservations()
        rs.add("old", lease_ms=0)
        rs.add("claimed", lease_ms=0)
        rs.claim("claimed")
        rs.add("fresh", lease_ms=60_000)
        assert rs.expired() == ["old"]
        rs.renew("old", 60_000)
        assert rs.expired() == []
        with pytest.raises(UnknownRequestError):
            rs.renew("never", 1000)

    asyncio.run(run())


def test_waiting_for_kv_ends_at_the_lease() -> None:
    async def run() -> None:
        rs = Reservations()
        res = rs.add("slow", lease_ms=50)
        with pytest.raises(TransferFailedError, match="did not arrive before its lease ended"):
            await asyncio.wait_for(rs.wait_for_kv(res), timeout=5)

    asyncio.run(run())
