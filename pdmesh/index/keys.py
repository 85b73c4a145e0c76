"""Redis key layout of the prefix index (one place, so publisher and lookup agree).

- ``pdmesh:holders:{hash}``   HASH: a field per member ``{worker_id}|{epoch}`` holding that
                              block, and ``#``: the fingerprint of those members (``update.py``).
                              Until 2026-11-26 a SET under ``pdmesh:blk:{hash}``: the new
                              name keeps a Redis that outlives an upgrade from serving one
                              layout to the other's commands (WRONGTYPE); the old keys go as
                              the workers that wrote them clear them, or with the Redis.
- ``pdmesh:wblocks:{member}`` SET of block hashes a member published (for resync)
- ``pdmesh:seq:{member}``     last applied event batch number
- ``pdmesh:hb:{worker_id}``   heartbeat (JSON: epoch, address, seq, unix ms), expires
- ``pdmesh:member:{role}:{worker_id}``  a live worker (JSON ``Member``), expires unless renewed
- ``pdmesh:members``        SET of those member keys (readers find members without a SCAN)
- ``pdmesh:index:log``      STREAM: every ``update.py`` call's operations, numbered by
                            ``pdmesh:index:logseq``, kept ``LOG_RETAIN_MS`` (routers' mirrors)
- ``pdmesh:publishers``     SET of the members holding any block (a mirror's snapshot)
"""

from __future__ import annotations

import hashlib

PREFIX = "pdmesh"
FINGERPRINT_FIELD = "#"
"""The block hash's field holding its members' fingerprint (no member is named ``#``:
members contain ``|``)."""


def block_key(block_hash: bytes) -> str:
    return f"{PREFIX}:holders:{block_hash.hex()}"


BLOCK_KEYS = f"{PREFIX}:holders:*"
"""The pattern of every block's key (for counting them; never scanned on a request's path)."""


def member(worker_id: str, epoch: str) -> str:
    return f"{worker_id}|{epoch}"


def member_fingerprint(member_id: str) -> str:
    """64 bits as 16 hex digits; a block's fingerprint is the XOR of its members'."""
    return hashlib.blake2b(member_id.encode(), digest_size=8).hexdigest()


def split_member(value: str) -> tuple[str, str]:
    worker_id, _, epoch = value.rpartition("|")
    return worker_id, epoch


def worker_blocks_key(member_id: str) -> str:
    return f"{PREFIX}:wblocks:{member_id}"


def seq_key(member_id: str) -> str:
    return f"{PREFIX}:seq:{member_id}"


def heartbeat_key(worker_id: str) -> str:
    return f"{PREFIX}:hb:{worker_id}"


MEMBERS_KEY = f"{PREFIX}:members"
"""The member keys, so a router's poll reads a handful of keys instead of scanning a
keyspace that holds a key per indexed block (a million at 1,000 workers)."""


def member_key(role: str, worker_id: str) -> str:
    return f"{PREFIX}:member:{role}:{worker_id}"


LOG_KEY = f"{PREFIX}:index:log"
"""Every index change in the order Redis applied it: what a router's ``IndexMirror`` tails."""
LOG_SEQ_KEY = f"{PREFIX}:index:logseq"
"""The log's entries are numbered 1, 2, ... so a reader tells a gap (entries trimmed before
it read them) from a quiet index."""
LOG_RETAIN_MS = 30_000
"""How long the log keeps an entry: a mirror further behind than this starts over from a
snapshot."""
PUBLISHERS_KEY = f"{PREFIX}:publishers"
"""The members that hold at least one block, so a snapshot reads their block sets instead
of scanning a keyspace with a key per block."""
