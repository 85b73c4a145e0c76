"""How long a decode stream may wait for its next message (``services/router/stalls.py``),
and a stalled worker kept from new requests while another can take them."""

from __future__ import annotations

from services.router.config import RouterConfig
from services.router.registry import Registry
from services.router.stalls import GAPS_KEPT, StallWatch
from services.router.worker_handle import WorkerHandle


def test_the_bound_follows_the_workers_own_gaps_within_floor_and_ceiling() -> None:
    watch = StallWatch()
    assert watch.bound(2.0, 30.0, 10.0) == 2.0  # nothing seen yet: the floor
    for _ in range(100):
        watch.delivered(0.01)
    assert watch.bound(2.0, 30.0, 10.0) == 2.0  # 10 x 10 ms is under the floor
    for _ in range(GAPS_KEPT):
        watch.delivered(0.5)  # a worker with long steps (a big batch, long prefill chunks)
    assert watch.bound(2.0, 30.0, 10.0) == 5.0
    watch.delivered(100.0)
    assert watch.bound(2.0, 30.0, 10.0) == 5.0  # one gap is under the 99th percentile
    for _ in range(GAPS_KEPT):
        watch.delivered(100.0)
    assert watch.bound(2.0, 30.0, 10.0) == 30.0  # never past the ceiling
    watch.delivered(None)  # a stream's first message says nothing of the gaps
    assert len(watch.gaps) == GAPS_KEPT


def test_a_stalled_worker_gets_no_new_request_until_it_delivers_unless_it_is_the_only_one() -> None:
    cfg = RouterConfig(model="m", stall_hold_s=60.0)
    reg = Registry(cfg)
    a, b = WorkerHandle("a:1", "decode", healthy=True), WorkerHandle("b:1", "decode", healthy=True)
    reg.workers = [a, b]
    a.stalls.stalled()
    assert reg.healthy("decode") == [b] and a.state == "stalled"
    b.healthy = False
    assert reg.healthy("decode") == [a]  # the only one left: it waits, it does not refuse
    b.healthy = True
    a.stalls.delivered(0.01)
    assert reg.healthy("decode") == [a, b] and a.state == "serving"
