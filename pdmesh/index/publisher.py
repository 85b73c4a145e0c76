"""Worker side: push block-stored / block-removed events into Redis, in numbered batches.

Events are drained from the engine's block pool and applied by one script call
(``update.py``), at most every ``interval``; given a ``wake`` event (set when the pool records its first
new event), an idle publisher sleeps until then or its next heartbeat instead of waking
every ``interval`` (50 times a second on an idle prefill worker; every process's
wake-ups slow the prefills beside it: docs/performance/log.md section 14).

When Redis is unreachable the worker keeps serving; events of the outage are dropped
and, once Redis answers again, the worker replaces everything it had published with a
snapshot of its current prefix cache (so a restarted Redis refills).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pdmesh.index import keys
from pdmesh.index.update import UPDATE, IndexUpdate, resumed
from pdmesh.kv.block_hash import BlockHash
from pdmesh.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

log = logging.getLogger(__name__)
HEARTBEAT_S = 0.5
"""Between heartbeats (their TTL is ``heartbeat_ttl_ms``, several beats)."""


class IndexPublisher:
    def __init__(self, url: str, worker_id: str, epoch: str, address: str,
                 interval: float = 0.02, heartbeat_ttl_ms: int = 3000,
                 client: aioredis.Redis | None = None) -> None:
        """``client``: a connection to share (the routing simulator publishes for 1,000
        workers through one); by default the publisher opens its own to ``url``."""
        self.redis = client or aioredis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self.worker_id = worker_id
        self.epoch = epoch
        self.address = address
        self.member = keys.member(worker_id, epoch)
        self.interval = interval
        self.heartbeat_ttl_ms = heartbeat_ttl_ms
        self.batch = 0
        self.synced = False
        self.failures = 0
        self._update = self.redis.register_script(UPDATE)

    async def run(self, take_events: Callable[[], list[KVEvent]],
                  cached_hashes: Callable[[], list[BlockHash]], wake: asyncio.Event | None = None) -> None:
        """Publish forever: ``take_events`` drains new events, ``cached_hashes`` snapshots;
        ``wake``, when given, is set whenever events are waiting to be taken."""
        last_beat = 0.0
        while True:
            if wake is not None:
                wake.clear()  # before taking: an event recorded after this sets it again
            events = take_events()
            try:
                if not self.synced:
                    await self.snapshot(cached_hashes())
                elif events:
                    await self.apply(events)
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    await self.heartbeat()
                    last_beat = time.monotonic()
            except (RedisError, OSError) as exc:
                if self.synced or self.failures == 0:
                    log.warning("prefix index unreachable (%s); serving on, will resync", exc)
                self.synced = False
                self.failures += 1
            await asyncio.sleep(self.interval)
            if wake is not None and self.synced:  # out of sync: retry every interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), max(0.0, last_beat + HEARTBEAT_S - time.monotonic()))

    async def apply(self, events: list[KVEvent]) -> None:
        update = IndexUpdate(self.member)
        for event in events:
            if isinstance(event, BlockStored):
                update.add(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                update.remove(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                update.clear()
        await self._send(update)

    async def _send(self, update: IndexUpdate) -> None:
        self.batch += 1
        for args in update.calls(self.batch):
            call: list[str | int] | None = args
            while call is not None:
                call = await self.run_call(call)

    async def run_call(self, call: list[str | int]) -> list[str | int] | None:
        """Run one call of an update's script; the call that goes on with it when the script
        stopped at its per-call bound (a clear larger than one call), else None."""
        return resumed(call, int(await self._update(args=call)))

    async def snapshot(self, cached: list[BlockHash]) -> None:
        """Replace everything this worker published with its current prefix cache."""
        update = IndexUpdate(self.member)
        update.clear()
        update.add(cached)
        await self._send(update)
        self.synced = True
        if self.failures:
            log.info("prefix index resynced with %d blocks", len(cached))

    async def heartbeat(self) -> None:
        beat = {"epoch": self.epoch, "address": self.address, "batch": self.batch,
                "unix_ms": int(time.time() * 1000)}
        await self.redis.set(keys.heartbeat_key(self.worker_id), json.dumps(beat),
                             px=self.heartbeat_ttl_ms)
