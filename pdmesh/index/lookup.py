"""Router side: "how many leading blocks of this chain does each worker hold?" in one trip.

A Lua script walks the chain's keys in order, intersecting as it goes, and stops at the
first block no candidate holds, so the cost is bounded by the matched prefix, not the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from pdmesh.index import keys
from pdmesh.kv.block_hash import BlockHash

_LONGEST_PREFIX = """
local depth = {}
local current = redis.call('SMEMBERS', KEYS[1])
for _, m in ipairs(current) do depth[m] = 1 end
for i = 2, #KEYS do
  if #current == 0 then break end
  local nxt = {}
  for _, m in ipairs(current) do
    if redis.call('SISMEMBER', KEYS[i], m) == 1 then
      depth[m] = i
      nxt[#nxt + 1] = m
    end
  end
  current = nxt
end
local out = {}
for m, d in pairs(depth) do
  out[#out + 1] = m
  out[#out + 1] = d
end
return out
"""


class PrefixIndex:
    """Lookups share a bounded pool of connections (a burst of requests waits for one
    instead of opening thousands), each with a deadline sized for a loaded event loop: a
    slow answer under load is not an unreachable Redis."""

    def __init__(self, url: str, timeout: float = 2.0, max_connections: int = 32) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout,
            socket_timeout=timeout, socket_connect_timeout=min(timeout, 1.0),
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self._script = self.redis.register_script(_LONGEST_PREFIX)

    async def longest_prefix(self, hashes: Sequence[BlockHash]) -> dict[tuple[str, str], int]:
        """``{(worker_id, epoch): matched leading blocks}``; raises RedisError when unreachable."""
        if not hashes:
            return {}
        raw = await self._script(keys=[keys.block_key(h) for h in hashes])
        out: dict[tuple[str, str], int] = {}
        for i in range(0, len(raw), 2):
            value = raw[i].decode() if isinstance(raw[i], bytes) else raw[i]
            out[keys.split_member(value)] = int(raw[i + 1])
        return out

    async def close(self) -> None:
        await self.redis.aclose()
