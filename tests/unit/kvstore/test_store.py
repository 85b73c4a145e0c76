from pdmesh.kv.events import BlockRemoved, BlockStored
from services.kvstore.store import BlockStore

H = [bytes([i]) * 16 for i in range(10)]


def test_reserve_commit_lookup_and_lru_eviction() -> None:
    s = BlockStore(capacity=3)
    rid, slots = s.reserve(H[:3])
    assert slots == [0, 1, 2]
    assert s.lookup(H[:3], pin_s=10) == []  # not readable before commit
    assert s.commit(rid, ok=True) == 3
    assert isinstance(s.take_events()[0], BlockStored)
    assert s.lookup(H[:2], pin_s=0) == [0, 1]  # H0, H1 now most recently used
    rid, slots = s.reserve([H[1], H[3]])
    assert slots == [-1, 2]  # H1 held already; H2 (least recent, unpinned) evicted
    assert s.take_events() == [BlockRemoved((H[2],))]
    s.commit(rid, ok=True)
    assert s.lookup([H[0], H[1], H[3]], pin_s=0) == [0, 1, 2]


def test_pinned_slots_are_not_evicted_and_failed_writes_free_slots() -> None:
    s = BlockStore(capacity=1)
    rid, _ = s.reserve([H[0]])
    s.commit(rid, ok=True)
    assert s.lookup([H[0]], pin_s=60) == [0]
    _, slots = s.reserve([H[1]])
    assert slots == [-1]  # the only slot is pinned by a reader
    s2 = BlockStore(capacity=2)
    rid, slots = s2.reserve([H[0], H[1]])
    assert s2.commit(rid, ok=False) == 0 and sorted(s2.free) == [0, 1]


def test_the_progress_pace_is_fast_only_while_a_transfer_may_wait_for_it() -> None:
    import time

    from pdmesh.kv.transfer.poller import AWAIT_INTERVAL_S, IDLE_INTERVAL_S
    from services.kvstore.pace import ProgressPace

    s, pace = BlockStore(capacity=2, reservation_ttl_s=0.05), ProgressPace()
    assert pace.interval(s) == IDLE_INTERVAL_S  # nothing announced: idle rate
    s.reserve([H[0]])
    pace.writes_expected()
    assert pace.wake.is_set() and pace.interval(s) == AWAIT_INTERVAL_S  # an offload's writes
    time.sleep(0.06)
    assert pace.interval(s) == IDLE_INTERVAL_S  # its writer never committed: lapsed, idle again
    assert not s.reservations
    pace.reads_expected()
    assert pace.interval(s) == AWAIT_INTERVAL_S  # a fetch's READ follows its lookup
    pace.reads_until = time.monotonic()  # the read window over
    assert pace.interval(s) == IDLE_INTERVAL_S
