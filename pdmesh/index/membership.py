"""Live membership through Redis, the mesh's one piece of infrastructure.

A worker started with ``--redis-url`` announces itself under
``pdmesh:member:{role}:{worker_id}`` with its address and epoch, renewed every
``interval_s`` with a TTL of ``ttl_ms``; on SIGTERM it deletes the key before it stops
taking requests (``leave``). Routers poll the keys (``read_members``) and add, drain and
forget workers without a restart, so the staleness bound is the poll interval for joins
and leaves, and the TTL plus the poll interval for a worker that dies without leaving.
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

MEMBER_TTL_MS = 3000
"""A member that stops renewing is gone this long after its last renewal."""


@dataclass(frozen=True, slots=True)
class Member:
    role: str
    worker_id: str
    address: str
    epoch: str
    """Changes on every start: a restarted worker is a new member at the same address."""


class MemberAnnouncer:
    """Keeps one worker's membership key alive until ``leave``."""

    def __init__(self, url: str, member: Member, ttl_ms: int = MEMBER_TTL_MS,
                 interval_s: float = 0.5) -> None:
        self.redis = aioredis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self.member = member
        self.key = keys.member_key(member.role, member.worker_id)
        self.ttl_ms = ttl_ms
        self.interval_s = interval_s
        self._left = False

    async def run(self) -> None:
        failing = False
        while not self._left:
            try:
                await self.redis.set(self.key, json.dumps(asdict(self.member)), px=self.ttl_ms)
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
        """Delete the key (routers stop sending new requests at their next poll)."""
        self._left = True
        try:
            await asyncio.wait_for(self.redis.delete(self.key), timeout=1.0)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not deregister from Redis (%s); the key expires in %d ms", exc, self.ttl_ms)


async def read_members(redis: aioredis.Redis) -> list[Member]:
    """Every live member (one SCAN and one MGET); unreadable records are skipped."""
    names = [k async for k in redis.scan_iter(match=keys.MEMBER_PATTERN, count=1000)]
    if not names:
        return []
    out = []
    for raw in await redis.mget(names):
        if raw is None:
            continue  # expired between SCAN and MGET
        try:
            out.append(Member(**json.loads(raw)))
        except (TypeError, ValueError):
            log.warning("ignoring a malformed membership record: %r", raw[:200])
    return out
