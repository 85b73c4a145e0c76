"""Chained KV-block hashes that every pdmesh process computes identically.

A block's hash names its *content in context*: the hash of the parent block, the block's
token ids and any extra keys (a per-tenant cache salt, an adapter name). Two processes that
agree on ``(algorithm, seed, block_size)`` produce byte-identical hashes for the same token
sequence, which is what lets the router look a prompt up in a shared index and a prefill
worker hand blocks to a decode worker by name.

This module is deliberately torch-free and never uses Python ``hash()`` or pickle: both
vary between processes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NewType

import xxhash

BlockHash = NewType("BlockHash", bytes)
"""16 bytes (xxh3_128) or 32 bytes (sha256) naming one full block in its prefix chain."""

HashAlgorithm = Literal["xxh3_128", "sha256"]

_DIGESTS = {
    "xxh3_128": lambda data: xxhash.xxh3_128_digest(data),
    "sha256": lambda data: hashlib.sha256(data).digest(),
}


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Computes the hash chain for token sequences.

    Workers advertise ``(algorithm, seed, block_size)`` so the router can refuse to pair
    workers whose hashes would not agree.
    """

    block_size: int
    """Tokens per KV block; only full blocks are hashed."""
    seed: int = 0
    """Folded into the root of every chain so that differently-seeded meshes never collide."""
    algorithm: HashAlgorithm = "xxh3_128"
    """Digest used for every link of the chain."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.algorithm not in _DIGESTS:
            raise ValueError(
                f"unknown hash algorithm {self.algorithm!r}; choose one of {sorted(_DIGESTS)}"
            )

    @property
    def root(self) -> BlockHash:
        """The parent hash of a chain's first block."""
        return self._digest(b"pdmesh-root" + struct.pack("<Q", self.seed & (2**64 - 1)))

    def _digest(self, data: bytes) -> BlockHash:
        return BlockHash(_DIGESTS[self.algorithm](data))

    def hash_block(
        self,
        parent: BlockHash | None,
        token_ids: Sequence[int],
        extra_keys: tuple[str, ...] = (),
    ) -> BlockHash:
        """Hash one full block given its parent's hash (``None`` for the first block)."""
        if len(token_ids) != self.block_size:
            raise ValueError(
                f"a block holds exactly {self.block_size} tokens, got {len(token_ids)}"
            )
        parts: list[bytes] = [parent if parent is not None else self.root]
        parts.append(struct.pack(f"<{len(token_ids)}I", *token_ids))
        for key in extra_keys:
            raw = key.encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return self._digest(b"".join(parts))

    def hash_tokens(
        self,
        token_ids: Sequence[int],
        extra_keys: tuple[str, ...] = (),
        parent: BlockHash | None = None,
        start: int = 0,
    ) -> list[BlockHash]:
        """Hash every full block of ``token_ids[start:]``, continuing the chain at ``parent``.

        ``start`` must be block-aligned; a trailing partial block is not hashed.
        """
        if start % self.block_size:
            raise ValueError(f"start {start} is not a multiple of block_size {self.block_size}")
        hashes: list[BlockHash] = []
        bs = self.block_size
        for begin in range(start, len(token_ids) - bs + 1, bs):
            parent = self.hash_block(parent, token_ids[begin : begin + bs], extra_keys)
            hashes.append(parent)
        return hashes


def extra_keys_for(cache_salt: str | None = None, adapter: str | None = None) -> tuple[str, ...]:
    """Extra keys folded into every block of a request, in a fixed order."""
    keys: list[str] = []
    if cache_salt:
        keys.append("salt:" + cache_salt)
    if adapter:
        keys.append("adapter:" + adapter)
    return tuple(keys)
