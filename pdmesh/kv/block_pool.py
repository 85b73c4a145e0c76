"""The pool of physical KV blocks: allocation, ref counts, the prefix-cache map and events.

Invariants (checked, never assumed):
- a block is free (in one of ``FreeBlocks``' queues) iff its ref count is 0;
- a block is in ``cached`` iff its ``block_hash`` is set, and then it is the map's entry;
- ``num_used + len(free blocks) == num_blocks``.

Freed blocks keep their hash, so a later request can revive them (a prefix hit) until
allocation pressure evicts them: blocks that never proved reusable first, least recently
used first within each kind (``pdmesh/kv/eviction.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pdmesh.kv.block_hash import BlockHash
from pdmesh.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from pdmesh.kv.eviction import EvictionPolicy, FreeBlocks
from pdmesh.kv.free_queue import KVBlock


@dataclass(frozen=True, slots=True)
class BlockPoolStats:
    """A snapshot of block accounting."""

    num_blocks: int
    used: int
    """Blocks referenced by at least one live request."""
    cached: int
    """Unreferenced blocks that still hold a reusable prefix (evictable)."""
    free: int
    """Unreferenced blocks holding nothing reusable."""


class BlockPool:
    """Owns every ``KVBlock``; hands them out, takes them back and tracks the prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, eviction: EvictionPolicy = "reuse") -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free = FreeBlocks(self.blocks, eviction, remember=num_blocks)
        """Free blocks in eviction order; remembers the pool's worth of evicted hashes."""
        self.cached: dict[BlockHash, KVBlock] = {}
        self._events: list[KVEvent] = []
        self.on_first_event: Callable[[], None] | None = None
        """Called when an event is recorded with none waiting to be taken (the index
        publisher's wake-up; it must be cheap and safe on any thread)."""
        self.num_evictions = 0

    # -- allocation -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation could take now (free plus evictable cached blocks)."""
        return len(self.free)

    def get_new_blocks(self, n: int) -> list[KVBlock] | None:
        """Take ``n`` free blocks in eviction order, evicting cached ones.

        Returns ``None`` (capacity, not an error) when fewer than ``n`` are available.
        """
        if n > len(self.free):
            return None
        out: list[KVBlock] = []
        evicted: list[BlockHash] = []
        for _ in range(n):
            block = self.free.popleft()
            if block.block_hash is not None:
                evicted.append(block.block_hash)
                self.free.evicted(block)
                self._uncache(block)
            block.ref_cnt = 1
            out.append(block)
        if evicted:
            self.num_evictions += len(evicted)
            self._record(BlockRemoved(tuple(evicted)))
        return out

    def touch(self, blocks: Iterable[KVBlock], reuse: bool = False) -> None:
        """Take a reference on blocks (revive them if free). ``reuse``: another request
        found them in the prefix cache, so they are kept longer once free again (a fork of
        the same request sharing its blocks is not reuse)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free.remove(block)
            block.ref_cnt += 1
            if reuse:
                self.free.mark_reused(block)

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 join their queue's tail in order.

        Callers pass a request's blocks tail-first so that a prefix's deepest blocks are
        evicted before its shared roots.
        """
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of {block!r}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free.append(block)

    # -- prefix cache -----------------------------------------------------------------
    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int]) -> KVBlock | None:
        """The cached block for ``block_hash`` if its stored tokens match exactly."""
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def cache_blocks(
        self,
        blocks: Sequence[KVBlock],
        hashes: Sequence[BlockHash],
        token_ids: Sequence[Sequence[int]],
        parent: BlockHash | None,
    ) -> None:
        """Register freshly computed full blocks as prefix-cache entries.

        A block whose hash another block already holds stays uncached (it is freed as
        plain memory later); the first holder remains the entry.
        """
        if not self.enable_caching:
            return
        stored: list[BlockHash] = []
        first_parent = parent
        for i, (block, block_hash, toks) in enumerate(zip(blocks, hashes, token_ids, strict=True)):
            if block.block_hash is not None:
                if block.block_hash != block_hash:
                    raise RuntimeError(f"{block!r} re-cached under a different hash")
                continue
            if block_hash in self.cached:
                continue
            if not stored:
                first_parent = hashes[i - 1] if i else parent
            if self.free.computed_again(block_hash):
                self.free.mark_reused(block)
            block.block_hash = block_hash
            block.token_ids = tuple(toks)
            self.cached[block_hash] = block
            stored.append(block_hash)
        if stored:
            self._record(BlockStored(tuple(stored), first_parent))

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is None or self.cached.pop(block.block_hash, None) is not block:
            raise RuntimeError(f"{block!r} is not the cache entry for its hash")
        block.block_hash = None
        block.token_ids = None

    def reset_prefix_cache(self) -> bool:
        """Forget every unreferenced cached block; refuses (False) while any block is in use."""
        if self.stats().used:
            return False
        for block in list(self.cached.values()):
            self._uncache(block)
        self.free.reset()
        self._record(AllBlocksCleared())
        return True

    def _record(self, event: KVEvent) -> None:
        self._events.append(event)
        if len(self._events) == 1 and self.on_first_event is not None:
            self.on_first_event()

    # -- observation ------------------------------------------------------------------
    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def stats(self) -> BlockPoolStats:
        """Block accounting; with no live request, ``used`` must be 0."""
        idle = len(self.free)
        used = self.num_blocks - idle
        cached = sum(1 for b in self.cached.values() if b.ref_cnt == 0)
        return BlockPoolStats(self.num_blocks, used, cached, idle - cached)
