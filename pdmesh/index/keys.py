"""Redis key layout of the prefix index (one place, so publisher and lookup agree).

- ``pdmesh:blk:{hash}``       SET of members ``{worker_id}|{epoch}`` holding that block
- ``pdmesh:wblocks:{member}`` SET of block hashes a member published (for resync)
- ``pdmesh:seq:{member}``     last applied event batch number
- ``pdmesh:hb:{worker_id}``   heartbeat (JSON: epoch, address, seq, unix ms), expires
- ``pdmesh:member:{role}:{worker_id}``  a live worker (JSON ``Member``), expires unless renewed
- ``pdmesh:members``        SET of those member keys (readers find members without a SCAN)
"""

from __future__ import annotations

PREFIX = "pdmesh"


def block_key(block_hash: bytes) -> str:
    return f"{PREFIX}:blk:{block_hash.hex()}"


def member(worker_id: str, epoch: str) -> str:
    return f"{worker_id}|{epoch}"


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
