"""One member's changes to the prefix index, applied by a Lua script in one atomic step.

Each block's key is a HASH whose fields are its members plus ``#``, the XOR of their
64-bit fingerprints (``keys.member_fingerprint``). The fingerprint lets a lookup tell
that a block has exactly the members of the block before it by reading one field, so
walking a prefix that 100 workers hold costs one read per block instead of 100
membership checks (``lookup.py``). Keeping it right needs the add or remove and the
fingerprint change together, conditional on the member having been absent or present:
hence a script, not a MULTI of blind commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pdmesh.index import keys
from pdmesh.kv.block_hash import BlockHash

UPDATE = """
local prefix, member, mfp, wkey, seqkey, batch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local budget = tonumber(ARGV[7])
local call, sub = redis.call, string.sub
local log, logseq, publishers = '@LOG@', '@LOG_SEQ@', '@PUBLISHERS@'
local function xor(a, b)
  return bit.tohex(bit.bxor(tonumber(sub(a, 1, 8), 16), tonumber(sub(b, 1, 8), 16)), 8)
      .. bit.tohex(bit.bxor(tonumber(sub(a, 9, 16), 16), tonumber(sub(b, 9, 16), 16)), 8)
end
local function add(h)
  local k = prefix .. h
  if call('HSETNX', k, member, 1) == 1 then
    local fp = call('HGET', k, '#')
    call('HSET', k, '#', fp and xor(fp, mfp) or mfp)
    call('SADD', wkey, h)
  end
end
local function remove(h)
  local k = prefix .. h
  if call('HDEL', k, member) == 1 then
    if call('HLEN', k) == 1 then
      call('DEL', k)
    else
      call('HSET', k, '#', xor(call('HGET', k, '#'), mfp))
    end
    call('SREM', wkey, h)
  end
end
local function logged(last)
  if last >= 8 then
    local id = call('XADD', log, '*', 'm', member, 'n', call('INCR', logseq), 'o', table.concat(ARGV, ',', 8, last))
    call('XTRIM', log, 'MINID', '~', tonumber(string.match(id, '^(%d+)')) - @RETAIN@)
  end
  if call('EXISTS', wkey) == 1 then call('SADD', publishers, member) else call('SREM', publishers, member) end
end
for i = 8, #ARGV do
  local op, h = sub(ARGV[i], 1, 1), sub(ARGV[i], 2)
  if op == '+' then
    add(h)
  elseif op == '-' then
    remove(h)
  else
    for _, held in ipairs(call('SPOP', wkey, budget)) do remove(held) end
    if call('SCARD', wkey) > 0 then
      logged(i)
      return i - 7
    end
  end
end
logged(#ARGV)
call('SET', seqkey, batch)
return 0
""".replace("@LOG@", keys.LOG_KEY).replace("@LOG_SEQ@", keys.LOG_SEQ_KEY).replace(
    "@PUBLISHERS@", keys.PUBLISHERS_KEY).replace("@RETAIN@", str(keys.LOG_RETAIN_MS))
"""ARGV: the block key prefix, the member, its fingerprint, its block set's key, its
sequence key, the batch number, how many blocks a clear removes per call, then operations
in order: ``+hash`` adds, ``-hash`` removes (hex), ``*`` removes everything the member
published. Returns 0 when done, else the (1-based) operation to call again from: a clear
of more blocks than the budget stops there.

Each call also appends the operations it ran to ``keys.LOG_KEY``, numbered, in the same
atomic step (a clear cut short is logged again by the call that goes on: clearing twice
is clearing), so a router's mirror that read the index at some entry and applies every
later one holds what Redis holds (``mirror.py``); and keeps the member in
``keys.PUBLISHERS_KEY`` while it holds any block."""

HEAD = 7
"""``UPDATE``'s arguments before the operations."""


MAX_OPS = 5_000
"""Block additions and removals per script call: Redis runs nothing else during one, and
5,000 take it ~10 ms (a big snapshot or clear goes in several, lookups answered between)."""


@dataclass
class IndexUpdate:
    """Operations for ``UPDATE``, in the order given."""

    member: str
    ops: list[str] = field(default_factory=list)

    def add(self, hashes: Iterable[BlockHash]) -> None:
        self.ops.extend("+" + h.hex() for h in hashes)

    def remove(self, hashes: Iterable[BlockHash]) -> None:
        self.ops.extend("-" + h.hex() for h in hashes)

    def clear(self) -> None:
        self.ops.append("*")

    def calls(self, batch: int, max_ops: int = MAX_OPS) -> list[list[str | int]]:
        """``UPDATE``'s arguments, one list per call of at most ``max_ops`` operations:
        each call is atomic, and none is larger than Redis takes (a big kvstore's snapshot)."""
        head: list[str | int] = [keys.block_key(b""), self.member, keys.member_fingerprint(self.member),
                                 keys.worker_blocks_key(self.member), keys.seq_key(self.member), batch, max_ops]
        return [[*head, *self.ops[i:i + max_ops]] for i in range(0, max(1, len(self.ops)), max_ops)]


def resumed(args: list[str | int], answer: int) -> list[str | int] | None:
    """The call that goes on where ``UPDATE`` called with ``args`` stopped (None: done)."""
    return args[:HEAD] + args[HEAD + answer - 1:] if answer else None
