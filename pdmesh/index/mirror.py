"""A router's own copy of the prefix index, kept current from the index's change log.

Asking Redis on every decision put a network round trip and a Lua walk on the path of
each request: at 1,000 simulated workers that was half a decision's time and most of its
tail (docs/routing.md, "The index in the router's memory"). Every change to the index
already goes through one script (``update.py``), which also appends it, numbered, to a
stream (``keys.LOG_KEY``); a router reads the index once (each member's block set),
notes the log entry that read stands at, and applies every later entry as it comes. The
walk then runs in the router's memory, in microseconds.

Redis stays the index's one source of truth: several routers keep their own mirrors, a
restarted router reads it again, and a router whose mirror is not current (starting,
behind the log's retention, cut off from Redis) asks Redis as before
(``mirrored_index.py``), counted per source.

Memory: blocks holding the same members share one member set, named by a number (one
for every block of a worker's private chain, one for a system prompt's blocks every
worker holds), so a block costs a dict entry from its hash to that number and an entry
in each member's own dict of blocks. Those dicts hold only bytes and ints, which the
garbage collector does not track: with the set objects themselves as values, each
collection of the generation holding them walked every block (53 ms for a young
collection with a million blocks, 70 ms for a full one, every few seconds in a busy
process).
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import sys
import time
from collections.abc import Sequence
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pdmesh.index import keys
from pdmesh.kv.block_hash import BlockHash

# What XREAD answers without decode_responses: per stream, its (entry id, fields) pairs.
_LogRead = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]

log = logging.getLogger(__name__)

HEAD = """
local id = '0-0'
if redis.call('EXISTS', ARGV[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', ARGV[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then id = info[i + 1] end
  end
end
return {id, redis.call('GET', ARGV[2]) or '0'}
"""
"""The log's last entry id and number, read together (an empty or trimmed log still knows
both)."""

STALE_S = 3.0
"""A mirror that has heard nothing from the log for this long (each blocking read returns
within ``block_ms`` even when the index is quiet) is not used."""


class IndexMirror:
    def __init__(self, url: str, block_ms: int = 1000, slice_ops: int = 2000) -> None:
        """``block_ms``: how long one read of the log waits for news; ``slice_ops``: after
        applying entries worth this many operations the mirror yields to the event loop,
        so a burst of changes (a worker's snapshot) does not hold a decision up."""
        self.redis = aioredis.from_url(url, socket_timeout=block_ms / 1000 + 2.0, socket_connect_timeout=1.0)
        self.block_ms = block_ms
        self.slice_ops = slice_ops
        self._head = self.redis.register_script(HEAD)
        self._reset()
        self.synced = False
        """The blocks are Redis's as of ``_last_id`` (False: being read, or cut off)."""
        self.heard_at = float("-inf")
        """When a read of the log last answered (monotonic)."""
        self._last_id: bytes | str = "0-0"
        self._seq = 0
        self.resyncs = 0
        """Reads of the whole index after the first (a gap in the log, Redis lost)."""
        self._read = False
        self.entries = 0
        """Log entries applied."""
        self.lag_s = 0.0
        """How long the last entry applied had been in the log, by Redis's clock (an entry's
        id is the millisecond Redis appended it) against this host's; 0 once a read finds
        nothing new. A mirror that falls behind a burst of changes shows it here."""

    # -- reading ---------------------------------------------------------------------
    def usable(self) -> bool:
        return self.synced and time.monotonic() - self.heard_at < STALE_S

    def holders_by_depth(self, hashes: Sequence[BlockHash]) -> list[tuple[int, list[str]]]:
        """As ``PrefixIndex.holders_by_depth``: the members holding leading blocks of the
        chain, grouped by how many, deepest first. Blocks with the same member set have
        the same members, so only where it changes are the members still walking
        intersected with the block's."""
        blocks, sets = self._blocks, self._members
        prev = blocks.get(hashes[0]) if hashes else None
        if prev is None:
            return []
        live = sets[prev]
        out: list[tuple[int, list[str]]] = []
        for depth in range(1, len(hashes)):
            cur = blocks.get(hashes[depth])
            if cur == prev:
                continue
            kept = live & sets[cur] if cur is not None else frozenset()
            if len(kept) < len(live):
                out.append((depth, list(live - kept)))
                live = kept
                if not live:
                    break
            prev = cur
        else:
            out.append((len(hashes), list(live)))
        out.reverse()
        return out

    def __len__(self) -> int:
        return len(self._blocks)

    def tracked_by_gc(self) -> bool:
        """Whether any of its block tables is in the garbage collector's care: a million
        blocks in tracked containers cost every collection ~50 ms, so none may be."""
        import gc

        return gc.is_tracked(self._blocks) or any(gc.is_tracked(blocks) for blocks in self._owned.values())

    # -- keeping up ------------------------------------------------------------------
    async def run(self) -> None:
        """Read the index, then follow its log, forever; reread after a gap or an outage."""
        failures = 0
        while True:
            try:
                if not self.synced:
                    await self.resync()
                await self.follow(self.block_ms)
                failures = 0
            except (RedisError, OSError) as exc:
                if failures == 0:
                    log.warning("index mirror cut off from Redis (%s); lookups ask Redis until it reads "
                                "the index again", exc)
                self.synced = False
                failures += 1
                await asyncio.sleep(min(0.1 * 2 ** min(failures, 5), 2.0))

    async def catch_up(self) -> None:
        """Apply everything the log held when called (reading the index first when needed).
        Ends: each pass applies entries up to that head or reads the index anew, which
        puts the mirror at or past it; a log emptied below it (trimmed) is a gap."""
        _, head = await self._head(args=[keys.LOG_KEY, keys.LOG_SEQ_KEY])
        while not self.synced or self._seq < int(head):
            if not self.synced:
                await self.resync()
            elif not await self.follow(None):
                self.synced = False

    async def resync(self) -> None:
        """Read every member's blocks, as of a log entry the reads come after: applying
        every later entry then gives Redis's state, since each entry sets its pairs of
        (member, block) to what they became whatever they were before."""
        self.resyncs += self._read
        self._read = True
        self.synced = False
        last_id, seq = await self._head(args=[keys.LOG_KEY, keys.LOG_SEQ_KEY])
        self._reset()
        members = sorted(m.decode() for m in cast(set[bytes], await self.redis.smembers(keys.PUBLISHERS_KEY)))
        for i in range(0, len(members), 32):
            pipe = self.redis.pipeline(transaction=False)
            for m in members[i:i + 32]:
                pipe.smembers(keys.worker_blocks_key(m))
            for m, held in zip(members[i:i + 32], await pipe.execute(), strict=True):
                m = sys.intern(m)
                for h in held:
                    self._add(m, binascii.unhexlify(h))
                await asyncio.sleep(0)  # a member at a time: lookups go on meanwhile (to Redis)
        self._last_id, self._seq = last_id, int(seq)
        self.synced = True
        self.heard_at = time.monotonic()
        log.info("index mirror read %d blocks of %d members at log entry %d", len(self._blocks), len(members),
                 self._seq)

    async def follow(self, block_ms: int | None) -> int:
        """One read of the log (waiting up to ``block_ms`` for news; None: not at all),
        applied; returns the entries read. A gap in the numbers (entries trimmed before
        this mirror read them) unsyncs it."""
        got = cast(_LogRead, await self.redis.xread({keys.LOG_KEY: self._last_id}, count=256, block=block_ms))
        self.heard_at = time.monotonic()
        if not got:
            self.lag_s = 0.0
        done = 0
        for _, entries in got:
            for entry_id, fields in entries:
                n = int(fields[b"n"])
                if n != self._seq + 1:
                    log.warning("index mirror missed log entries %d-%d (trimmed); reading the index again",
                                self._seq + 1, n - 1)
                    self.synced = False
                    return len(entries)
                done += self._apply(sys.intern(fields[b"m"].decode()), fields[b"o"])
                self._last_id, self._seq = entry_id, n
                self.entries += 1
                self.lag_s = max(0.0, time.time() - int(entry_id.split(b"-", 1)[0]) / 1000)
                if done >= self.slice_ops:
                    await asyncio.sleep(0)
                    done = 0
            return len(entries)
        return 0

    def _apply(self, member: str, ops: bytes) -> int:
        parts = ops.split(b",")
        for op in parts:
            kind = op[:1]
            if kind == b"+":
                self._add(member, binascii.unhexlify(op[1:]))
            elif kind == b"-":
                self._remove(member, binascii.unhexlify(op[1:]))
            else:
                self._clear(member)
        return len(parts)

    def _reset(self) -> None:
        self._blocks: dict[bytes, int] = {}
        """Block hash -> the number of its member set."""
        self._owned: dict[str, dict[bytes, None]] = {}
        """Member -> its blocks (a dict as a set: untracked by the garbage collector)."""
        self._members: list[frozenset[str]] = []
        """Member set by number (freed numbers hold an empty set)."""
        self._uses: list[int] = []
        """Blocks per member set."""
        self._numbers: dict[frozenset[str], int] = {}
        self._free: list[int] = []

    def _add(self, member: str, h: bytes) -> None:
        cur = self._blocks.get(h)
        if cur is None:
            members = frozenset((member,))
        elif member in self._members[cur]:
            return
        else:
            members = self._members[cur] | {member}
        self._owned.setdefault(member, {})[h] = None
        self._move(h, cur, members)

    def _remove(self, member: str, h: bytes) -> None:
        cur = self._blocks.get(h)
        if cur is None or member not in self._members[cur]:
            return
        owned = self._owned[member]
        del owned[h]
        if not owned:
            del self._owned[member]
        self._move(h, cur, self._members[cur] - {member})

    def _clear(self, member: str) -> None:
        for h in self._owned.pop(member, ()):
            cur = self._blocks[h]
            self._move(h, cur, self._members[cur] - {member})

    def _move(self, h: bytes, cur: int | None, members: frozenset[str]) -> None:
        if cur is not None:
            self._uses[cur] -= 1
            if not self._uses[cur]:
                del self._numbers[self._members[cur]]
                self._members[cur] = frozenset()
                self._free.append(cur)
        if not members:
            del self._blocks[h]
            return
        new = self._numbers.get(members)
        if new is None:
            if self._free:
                new = self._free.pop()
                self._members[new] = members
            else:
                new = len(self._members)
                self._members.append(members)
                self._uses.append(0)
            self._numbers[members] = new
        self._uses[new] += 1
        self._blocks[h] = new

    async def close(self) -> None:
        await self.redis.aclose()

