"""KV write throughput is bytes over the time a write was in flight, overlapping writes
counted once (``pdmesh bench mesh``'s KV row, ``WorkerInfo.kv_transfer_seconds``)."""

from __future__ import annotations

import pytest

from pdmesh.kv.transfer.runner import BusyClock


def test_overlapping_writes_count_their_union_once() -> None:
    clock = BusyClock()
    clock.start(10.0)
    clock.start(10.5)  # posted while the first is in flight
    clock.stop(11.0)  # the second ends first ...
    clock.stop(10.8)  # ... and the first's end is reported after it
    assert clock.seconds == pytest.approx(1.0)
    clock.start(20.0)  # an idle gap is not counted
    clock.stop(20.25)
    assert clock.seconds == pytest.approx(1.25)


def test_an_open_period_is_counted_when_it_closes() -> None:
    clock = BusyClock()
    clock.start(1.0)
    assert clock.seconds == 0.0
    clock.stop(3.0)
    assert clock.seconds == pytest.approx(2.0)
