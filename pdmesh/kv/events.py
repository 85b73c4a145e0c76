"""KV-cache events: what a worker's prefix cache gained or lost.

The Redis prefix index consumes these (a later component); the engine only records them.
They are plain frozen records so they can be serialised without pickle.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmesh.kv.block_hash import BlockHash


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks became reusable prefix-cache entries, in chain order."""

    block_hashes: tuple[BlockHash, ...]
    parent_hash: BlockHash | None
    """Hash of the block before the first one (None at the start of a chain)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cache entries were evicted and no longer exist on this worker."""

    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The worker dropped its whole prefix cache (reset or restart)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
