"""Router side: "how many leading blocks of this chain does each worker hold?" in one trip.

A Lua script walks the chain's keys in order, keeping the members that hold every block
so far, and stops at the first block none of them holds, so the cost is bounded by the
matched prefix, not the prompt. A block whose members' fingerprint equals the previous
block's has the same members (``update.py``), so the walk checks members one by one only
where the holders change: checked member by member at every block, a 64-block prefix
that 128 workers hold cost 4.1 ms of Redis time per lookup and one that 1,000 hold 33 ms
(``scripts/probes/routing/route_decisions.py --holders=H`` on the code before; 0.17 and 0.51 ms now).
The chain travels as one hex string the script cuts into ``keys.block_key`` names:
packing a long prompt's keys as separate arguments took ~0.1 ms of a 0.5 ms lookup. (The
keys are not declared, so the index needs one Redis, not a cluster; it is one Redis.)
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from pdmesh.index import keys
from pdmesh.kv.block_hash import BlockHash

_LONGEST_PREFIX = """
local prefix, width, chain = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local call, sub = redis.call, string.sub
local live, n, out, fp = {}, 0, {}, nil
local first = call('HGETALL', prefix .. sub(chain, 1, width))
for j = 1, #first, 2 do
  if first[j] == '#' then
    fp = first[j + 1]
  else
    n = n + 1
    live[n] = first[j]
  end
end
local i, blocks = 2, #chain / width
while n > 0 and i <= blocks do
  local k = prefix .. sub(chain, (i - 1) * width + 1, i * width)
  local f = call('HGET', k, '#')
  if f ~= fp then
    fp = f
    local j, ended, has = 1, {}, nil
    if f and call('HLEN', k) - 1 < n then
      has = {}
      for _, m in ipairs(call('HKEYS', k)) do has[m] = true end
    end
    while j <= n do
      local held = f and (has and has[live[j]] or (not has and call('HEXISTS', k, live[j]) == 1))
      if held then
        j = j + 1
      else
        ended[#ended + 1] = live[j]
        live[j] = live[n]
        live[n] = nil
        n = n - 1
      end
    end
    if #ended > 0 then
      out[#out + 1] = i - 1
      out[#out + 1] = table.concat(ended, '\\n')
    end
  end
  i = i + 1
end
if n > 0 then
  out[#out + 1] = i - 1
  out[#out + 1] = table.concat(live, '\\n', 1, n)
end
return out
"""
"""``live``: the members holding every block so far. Where a block's fingerprint equals
the previous block's, its members are the previous block's, so ``live`` (a subset of
them) holds it too; elsewhere each live member is checked (against the block's members
read at once when they are fewer than ``live``: a conversation's own blocks after a
system prompt many hold), and those that lack the block leave ``live`` (swapped with the
last). The answer is grouped by depth, ``{depth, "member\\nmember...", ...}``: one
string per depth instead of two replies per member, which redis-py parsed in ~5 ms at
1,000 holders (``scripts/probes/routing/route_decisions.py --holders=1000`` before: a lookup 38.0 ms
p50, of which Redis 33.0)."""


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

    async def holders_by_depth(self, hashes: Sequence[BlockHash]) -> list[tuple[int, list[str]]]:
        """The members (``worker_id|epoch``) holding leading blocks of the chain, grouped by
        how many, deepest first; raises RedisError when unreachable."""
        if not hashes:
            return []
        width = 2 * len(hashes[0])
        raw = await self._script(args=[keys.block_key(b""), width, b"".join(hashes).hex()])
        return [(int(raw[i]), raw[i + 1].decode().split("\n")) for i in range(len(raw) - 2, -1, -2)]

    async def longest_prefix(self, hashes: Sequence[BlockHash]) -> dict[tuple[str, str], int]:
        """``{(worker_id, epoch): matched leading blocks}``; raises RedisError when unreachable."""
        return by_member(await self.holders_by_depth(hashes))

    async def catch_up(self) -> None:
        """Nothing to do: every lookup asks Redis (``MirroredIndex.catch_up`` reads its log),
        so a measurement can ready either kind of index the same way."""

    async def close(self) -> None:
        await self.redis.aclose()


def by_member(groups: list[tuple[int, list[str]]]) -> dict[tuple[str, str], int]:
    """``holders_by_depth``'s groups as ``{(worker_id, epoch): depth}``."""
    return {keys.split_member(m): depth for depth, members in groups for m in members}
