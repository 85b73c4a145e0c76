"""Which free block an allocation takes: the order in which a prefix cache forgets.

Least recently used alone lets blocks that no request will read again (the fresh tail of
every prompt, a finished conversation) push out blocks many requests read (a system
prompt used now and then). On ``pdmesh bench route-mesh``'s traffic (12 Zipf-popular
512-token prefixes with fresh 64-token suffixes and growing conversations, prefill pools
holding the prefixes with some room), the prefill workers computed 1.21-1.22x the
oracle's prompt tokens over 480 requests under LRU; replayed through this pool
(``scripts/probes/routing/prefix_eviction_model.py``), most of what LRU computes again are shared-prefix
blocks that one-off blocks had evicted (docs/routing.md, "Eviction").

Policy ``reuse`` (the default) keeps two LRU queues of free blocks. A block whose content
has proven reusable waits in the *reused* queue: a later request hit it as a prefix, or
it was computed again soon after its eviction (its hash is among the pool's most recently
evicted, ``recently_evicted``). Every other free block waits in the *once* queue, which
allocation empties first. A rare prefix therefore survives the suffixes of the requests
between its uses once it has been seen twice; a new prefix costs at most one extra
computation before it is kept. This is 2Q (Johnson and Shasha, VLDB 1994) with a hit, not
only a return after eviction, counting as reuse, since here a hit is another request. A
stale reused block goes only when no once block is left, in LRU order among the reused.

Policy ``lru`` keeps one queue (every block "once"), as vLLM's block pool does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Literal

from pdmesh.kv.block_hash import BlockHash
from pdmesh.kv.free_queue import FreeBlockQueue, KVBlock

EvictionPolicy = Literal["reuse", "lru"]


class RecentlyEvicted:
    """The last ``capacity`` hashes evicted, oldest dropped first: how a pool tells a
    block computed again from a new one."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._hashes: OrderedDict[BlockHash, None] = OrderedDict()

    def add(self, block_hash: BlockHash) -> None:
        if self.capacity <= 0:
            return
        self._hashes[block_hash] = None
        self._hashes.move_to_end(block_hash)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def take(self, block_hash: BlockHash) -> bool:
        """Whether ``block_hash`` was evicted recently (and forget it: it is back)."""
        if block_hash not in self._hashes:
            return False
        del self._hashes[block_hash]
        return True

    def clear(self) -> None:
        self._hashes.clear()

    def __len__(self) -> int:
        return len(self._hashes)


class FreeBlocks:
    """The free blocks of a pool in eviction order (head of ``once``, then of ``reused``).

    A block's queue is its ``reused`` flag, which only changes while the block is out of
    both (referenced), so ``remove`` always unlinks it from the queue that counts it."""

    def __init__(self, blocks: Iterable[KVBlock], policy: EvictionPolicy = "reuse", remember: int = 0) -> None:
        if policy not in ("reuse", "lru"):
            raise ValueError(f"unknown eviction policy {policy!r} (reuse or lru)")
        self.policy = policy
        self._once = FreeBlockQueue(blocks)
        self._reused = FreeBlockQueue(())
        self.recently_evicted = RecentlyEvicted(remember if policy == "reuse" else 0)

    def __len__(self) -> int:
        return len(self._once) + len(self._reused)

    @property
    def num_reused(self) -> int:
        """Free blocks in the reused queue (evicted only when no once block is left)."""
        return len(self._reused)

    def append(self, block: KVBlock) -> None:
        """``block`` became free: the tail of its queue (evicted last within it)."""
        (self._reused if block.reused else self._once).append(block)

    def remove(self, block: KVBlock) -> None:
        (self._reused if block.reused else self._once).remove(block)

    def popleft(self) -> KVBlock:
        """The block to evict next; the caller clears what it held (``evicted``)."""
        return (self._once if len(self._once) else self._reused).popleft()

    def mark_reused(self, block: KVBlock) -> None:
        """``block`` (referenced, so in no queue) proved reusable: free, it waits in the
        reused queue. No effect under ``lru``."""
        if block.ref_cnt <= 0:
            raise RuntimeError(f"{block!r} is free: its queue cannot change under it")
        if self.policy == "reuse":
            block.reused = True

    def evicted(self, block: KVBlock) -> None:
        """``block``, cached and just taken by ``popleft``, is about to lose its content:
        remember its hash, forget its reuse (only a cached block can have proved reusable)."""
        if block.block_hash is not None:
            self.recently_evicted.add(block.block_hash)
        block.reused = False

    def computed_again(self, block_hash: BlockHash) -> bool:
        """Whether a block now cached under ``block_hash`` had been evicted recently."""
        return self.recently_evicted.take(block_hash)

    def reset(self) -> None:
        """Forget every block's reuse (the prefix cache was cleared; every block is free)."""
        while len(self._reused):
            block = self._reused.popleft()
            block.reused = False
            self._once.append(block)
        self.recently_evicted.clear()
