import pytest

from pdmesh.errors import UnknownRequestError
from services.decode.reservations import Reservations


def test_one_record_from_reserve_to_claim() -> None:
    rs = Reservations()
    res = rs.add("r1", lease_ms=60_000)
    assert res.transfer_id.startswith("r1/") and len(rs) == 1 and rs.awaiting_kv()
    assert rs.claim("r1", res.transfer_id) is res
    assert not rs.awaiting_kv() and len(rs) == 0  # claimed: nothing more is written into it
    with pytest.raises(UnknownRequestError, match="expired, released or claimed"):
        rs.claim("r1", res.transfer_id)  # a second Decode for the same reservation
    assert rs.pop("r1") is None


def test_a_decode_for_an_earlier_reservation_of_the_request_is_refused() -> None:
    """Released and reserved again (a retry), the request has a new transfer id: a Decode
    carrying the old one was for KV written into the old blocks."""
    rs = Reservations()
    old = rs.add("r1", lease_ms=60_000)
    rs.pop("r1")
    new = rs.add("r1", lease_ms=60_000)
    assert new.transfer_id != old.transfer_id
    with pytest.raises(UnknownRequestError, match="released and replaced"):
        rs.claim("r1", old.transfer_id)
    assert len(rs) == 1 and rs.awaiting_kv()  # the live reservation is untouched
    assert rs.claim("r1", new.transfer_id) is new


def test_expiry_spares_claimed_records_and_renewal_extends() -> None:
    rs = Reservations()
    rs.add("old", lease_ms=0)
    claimed = rs.add("claimed", lease_ms=0)
    rs.claim("claimed", claimed.transfer_id)
    rs.add("fresh", lease_ms=60_000)
    assert rs.expired() == ["old"]
    rs.renew("old", 60_000)
    assert rs.expired() == []
    with pytest.raises(UnknownRequestError):
        rs.renew("never", 1000)
