"""The router's prefix index: its own mirror of the index while that is current, Redis
otherwise (``mirror.py`` says why and how the mirror keeps up), each lookup counted by
what answered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pdmesh.index.lookup import PrefixIndex, by_member
from pdmesh.index.mirror import IndexMirror
from pdmesh.kv.block_hash import BlockHash


class MirroredIndex:
    """The router's index: its mirror while current, Redis otherwise (both counted in
    ``lookups``, by source)."""

    def __init__(self, url: str) -> None:
        self.mirror = IndexMirror(url)
        self.redis = PrefixIndex(url)
        self.lookups: Counter[str] = Counter()

    async def holders_by_depth(self, hashes: Sequence[BlockHash]) -> list[tuple[int, list[str]]]:
        if self.mirror.usable():
            self.lookups["mirror"] += 1
            return self.mirror.holders_by_depth(hashes)
        self.lookups["redis"] += 1
        return await self.redis.holders_by_depth(hashes)

    async def longest_prefix(self, hashes: Sequence[BlockHash]) -> dict[tuple[str, str], int]:
        return by_member(await self.holders_by_depth(hashes))

    async def catch_up(self) -> None:
        """Bring the mirror to the index as of now (measurements; the router runs ``run``)."""
        await self.mirror.catch_up()

    async def run(self) -> None:
        await self.mirror.run()

    async def close(self) -> None:
        await self.mirror.close()
        await self.redis.close()
