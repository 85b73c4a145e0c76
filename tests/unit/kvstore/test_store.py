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
