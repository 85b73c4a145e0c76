"""Live membership through Redis, the mesh's one piece of infrastructure.

A worker started with ``--redis-url`` announces itself under
``pdmesh:member:{role}:{worker_id}`` with its address and epoch, renewed every
``interval_s`` with a TTL of ``ttl_ms`` and listed in the ``pdmesh:members`` set; on
SIGTERM it rewrites the record as ``leaving`` before it stops taking requests (``leave``).
Routers poll the records (``read_members``): a new member is added and asked for its
``Info`` at once, a leaving one gets no new requests. A record that merely expires says
little (a worker under heavy load can miss a renewal), so death is decided as before by
failing ``Info`` calls; a worker that both fails them and has no record is forgotten.
Static ``--prefill`` / ``--decode`` lists stay valid as seeds.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pdmesh.index import keys

log = logging.getLogger(__name__)

MEMBER_TTL_MS = 5000
"""A record not renewed for this long disappears (and with it, once its Info fails too,
the worker)."""


@dataclass(frozen=True, slots=True)
class Member:
    role: str
    worker_id: str
    address: str
    epoch: str
    """Changes on every start: a restarted worker is a new member at the same address."""
    state: str = "serving"
    """"serving", or "leaving" once it got SIGTERM (drain: no new requests)."""


class MemberAnnouncer:
    """Keeps one worker's membership key alive until ``leave``."""

    def __init__(self, url: str, member: Member, ttl_ms: int = MEMBER_TTL_MS,
                 interval_s: float = 1.0) -> None:
        self.redis = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.member = member
        self.key = keys.member_key(member.role, member.worker_id)
        self.ttl_ms = ttl_ms
        self.interval_s = interval_s
        self._left = False

    async def run(self) -> None:
        failing = False
        while not self._left:
            try:
                await announce(self.redis, self.key, json.dumps(asdict(self.member)), self.ttl_ms)
                if failing:
                    log.info("membership renewed in Redis again")
                failing = False
            except (RedisError, OSError) as exc:
                if not failing:
                    log.warning("cannot renew membership in Redis (%s); routers will drop this "
                                "worker after %d ms, serving on and retrying", exc, self.ttl_ms)
                failing = True
            await asyncio.sleep(self.interval_s)

    async def leave(self) -> None:
        """Mark the record "leaving" (routers stop sending new requests at their next poll);
        it expires on its own after the TTL."""
        self._left = True
        record = json.dumps(asdict(self.member) | {"state": "leaving"})
        try:
            await asyncio.wait_for(announce(self.redis, self.key, record, self.ttl_ms), timeout=1.0)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not announce leaving in Redis (%s); routers will notice the "
                        "drain when this worker stops answering", exc)


async def announce(redis: aioredis.Redis, key: str, record: str, ttl_ms: int) -> None:
    """Write a member record with its TTL and list its key, in one round trip."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(key, record, px=ttl_ms)
        pipe.sadd(keys.MEMBERS_KEY, key)
        await pipe.execute()


async def read_members(redis: aioredis.Redis) -> list[Member]:
    """Every live member (one SMEMBERS and one MGET); unreadable records are skipped, and
    keys whose record expired are dropped from the set (a member that renews again adds
    its key back with the record)."""
    names = sorted(await redis.smembers(keys.MEMBERS_KEY))
    if not names:
        return []
    out, expired = [], []
    for name, raw in zip(names, await redis.mget(names), strict=True):
        if raw is None:
            expired.append(name)
            continue
        try:
            out.append(Member(**json.loads(raw)))
        except (TypeError, ValueError):
            log.warning("ignoring a malformed membership record: %r", raw[:200])
    if expired:
        await redis.srem(keys.MEMBERS_KEY, *expired)
    return out
