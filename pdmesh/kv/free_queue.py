"""An O(1) doubly-linked queue of free KV blocks, kept in eviction (LRU) order.

Blocks with ref count 0 live here. The head is evicted first; a block freed by a finished
request goes to the tail, and a cached block that gets a prefix hit is unlinked from the
middle in O(1). The links live on the blocks themselves so no per-operation allocation
happens on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pdmesh.kv.block_hash import BlockHash


@dataclass(slots=True, eq=False)
class KVBlock:
    """One physical block of the paged KV cache (all layers, ``block_size`` tokens)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    """Set while this block is the prefix-cache entry for its hash."""
    token_ids: tuple[int, ...] | None = None
    """The tokens the hash was computed from; a hit is verified against them."""
    reused: bool = False
    """Its content proved reusable (``pdmesh/kv/eviction.py``): free, it is evicted after
    every block that did not."""
    prev_free: KVBlock | None = None
    next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return (f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None}"
                f"{', reused' if self.reused else ''})")


class FreeBlockQueue:
    """Doubly-linked list of free blocks with sentinel head and tail."""

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        """Remove and return the block that should be evicted next."""
        block = self._head.next_free
        if block is self._tail or block is None:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        """Unlink ``block`` wherever it is; it must be in the queue."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise RuntimeError(f"{block!r} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def append(self, block: KVBlock) -> None:
        """Put ``block`` at the tail (evicted last)."""
        if block.prev_free is not None or block.next_free is not None:
            raise RuntimeError(f"{block!r} is already in the free queue")
        last = self._tail.prev_free
        if last is None:
            raise RuntimeError("free queue tail sentinel lost its link")
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def __iter__(self) -> Iterator[KVBlock]:
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free
