import pytest

from pdmesh.kv.free_queue import FreeBlockQueue, KVBlock


def ids(q: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in q]


def test_order_remove_and_append() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert ids(q) == [0, 1, 2, 3, 4] and len(q) == 5
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4]
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    q.append(blocks[0])
    assert ids(q) == [1, 3, 4, 2, 0] and len(q) == 5


def test_misuse_raises() -> None:
    blocks = [KVBlock(i) for i in range(2)]
    q = FreeBlockQueue(blocks)
    with pytest.raises(RuntimeError, match="already in the free queue"):
        q.append(blocks[0])
    q.remove(blocks[0])
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(blocks[0])
    q.popleft()
    with pytest.raises(IndexError):
        q.popleft()
