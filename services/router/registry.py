"""The workers a router knows: health, load and compatibility from their ``Info``.

Workers come from the static ``--prefill`` / ``--decode`` lists (seeds) and, with a Redis
URL, from the live membership (``pdmesh/index/membership.py``): a member that appears is
added and asked for its ``Info`` at once; one that announces it is leaving (drain) gets no
new requests; death is still decided by failing ``Info`` calls. A joined worker is
forgotten once this router has nothing in flight on it and it left, or is down with no
membership record. A seed that leaves stays listed until it announces itself again.

A worker is refused (and never routed to) when its block size, hash seed or algorithm
(or dtype, unless the router's is "auto") differ from the router's contract, when it
serves another model, or when its KV layout (compat hash) differs from the mesh's first
accepted worker. The reason is logged once
and shown by ``MeshAdmin.ListWorkers``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import grpc

from pdmesh.index.membership import Member
from pdmesh.mesh_types import WorkerInfo
from pdmesh.model.source import identity_name
from pdmesh.rpc.clients import fetch_info
from pdmesh.rpc.status import InferredUnavailable
from services.router.config import RouterConfig
from services.router.worker_handle import WorkerHandle

log = logging.getLogger(__name__)


def _forget(polls: dict[WorkerHandle, asyncio.Task[None]], worker: WorkerHandle, _: asyncio.Task[None]) -> None:
    """A finished Info poll leaves the table, so the next round starts another."""
    polls.pop(worker, None)


class Registry:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.workers = [WorkerHandle(a, "prefill") for a in cfg.prefill] + [
            WorkerHandle(a, "decode") for a in cfg.decode
        ]
        self.mesh_compat: str | None = None
        self._probes: dict[WorkerHandle, asyncio.Task[None]] = {}

    def healthy(self, role: str) -> list[WorkerHandle]:
        """The workers of ``role`` a new request may go to: healthy, and not holding off
        after a stalled stream while another is not."""
        ok = [w for w in self.workers if w.role == role and w.healthy]
        return [w for w in ok if not w.stalls.holding(self.cfg.stall_hold_s)] or ok

    def call_failed(self, handle: WorkerHandle, exc: grpc.aio.AioRpcError) -> None:
        """A request's call to ``handle`` failed with ``exc``: unreachable marks it down
        (no new requests until its Info answers), full says nothing about its health,
        anything else, an UNAVAILABLE the router inferred included, makes it a suspect."""
        code = exc.code()
        if code == grpc.StatusCode.UNAVAILABLE and not isinstance(exc, InferredUnavailable):
            handle.healthy = False
        elif code != grpc.StatusCode.RESOURCE_EXHAUSTED:
            self.suspect(handle)

    def suspect(self, handle: WorkerHandle) -> None:
        """A request failed on ``handle`` in a way that does not say whether the worker
        lives (a KV write that failed, a stream that broke): ask for its Info now rather
        than mark it down. Marked down, a live worker got no request until the next
        refresh, and the only decode worker's one failed write refused every request
        routed meanwhile; a dead one is down as soon as the probe finds it unreachable."""
        if handle in self._probes:
            return
        probe = asyncio.get_running_loop().create_task(self._refresh(handle, probing=True))
        self._probes[handle] = probe
        probe.add_done_callback(lambda _: self._probes.pop(handle, None))

    async def refresh(self) -> None:
        await asyncio.gather(*(self._refresh(w) for w in self.workers))

    async def _refresh(self, w: WorkerHandle, probing: bool = False) -> None:
        try:
            info = await fetch_info(w.address, timeout=self.cfg.info_timeout_s)
        except grpc.aio.AioRpcError as exc:
            w.failures += 1
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                # Unreachable, not slow: no connection, or a connection whose pings went
                # unanswered (a stopped process: pdmesh/rpc/server.py, MESH_CHANNEL_OPTIONS).
                # Down at once; the next Info it answers brings it back.
                if w.healthy:
                    log.warning("%s worker at %s is unreachable%s: %s", w.role, w.address,
                                " after a failed request" if probing else "", exc.details())
                w.healthy = False
            elif w.healthy and w.failures >= self.cfg.down_after_failures:
                log.warning("%s worker at %s stopped answering (%d Info calls failed: %s)",
                            w.role, w.address, w.failures, exc.code().name)
                w.healthy = False
            return
        w.failures = 0
        w.info = info
        w.info_at = time.monotonic()
        reason = self._refusal(w, info)
        if reason != w.refused and reason:
            log.error("refusing %s worker %s at %s: %s", w.role, info.worker_id, w.address, reason)
        w.refused = reason
        w.healthy = not reason and not w.left

    def _refusal(self, w: WorkerHandle, info: WorkerInfo) -> str:
        cfg = self.cfg
        checks = [
            (info.role == w.role, f"it is not a {w.role} worker"),
            (info.model == identity_name(cfg.model),
             f"it serves model {info.model!r}, the mesh serves {identity_name(cfg.model)!r}"),
            (info.block_size == cfg.block_size,
             f"block_size {info.block_size} differs from the mesh's {cfg.block_size}"),
            (info.hash_seed == cfg.hash_seed,
             f"hash_seed {info.hash_seed} differs from the mesh's {cfg.hash_seed}"),
            (info.hash_algorithm == cfg.hash_algorithm,
             f"hash_algorithm {info.hash_algorithm!r} differs from the mesh's {cfg.hash_algorithm!r}"),
            (cfg.dtype == "auto" or info.dtype == cfg.dtype,
             f"dtype {info.dtype!r} differs from the mesh's {cfg.dtype!r}"),
        ]
        for ok, why in checks:
            if not ok:
                return why
        if self.mesh_compat is None:
            self.mesh_compat = info.compat_hash
        if info.compat_hash != self.mesh_compat:
            return f"KV layout/dtype (compat {info.compat_hash}) differs from the mesh's ({self.mesh_compat})"
        return ""

    async def run(self) -> None:
        """Ask every worker for its Info each ``info_interval_s``; a worker whose last call is
        still out (one that hangs, up to ``info_timeout_s``) is skipped, so that it delays
        nobody else's."""
        polls: dict[WorkerHandle, asyncio.Task[None]] = {}
        while True:
            for w in self.workers:
                if w not in polls:
                    polls[w] = task = asyncio.get_running_loop().create_task(self._refresh(w))
                    task.add_done_callback(functools.partial(_forget, polls, w))
            await asyncio.sleep(self.cfg.info_interval_s)

    def sync_members(self, members: list[Member]) -> list[WorkerHandle]:
        """Apply one reading of the membership; returns the workers that joined (or came back)."""
        records = {(m.role, m.address): m for m in members if m.role in ("prefill", "decode")}
        known = {(w.role, w.address): w for w in self.workers}
        joined = []
        for key, m in records.items():
            w = known.get(key)
            if m.state == "leaving":
                if w is not None and not w.left:
                    w.left, w.healthy = True, False
                    log.info("%s worker %s is leaving: no new requests", m.role, m.worker_id)
                continue
            if w is None:
                w = WorkerHandle(m.address, m.role, joined=True)
                self.workers.append(w)
                log.info("%s worker %s joined at %s", m.role, m.worker_id, m.address)
            elif w.left:
                log.info("%s worker %s at %s is back", m.role, m.worker_id, m.address)
            elif w.member:
                continue
            w.member, w.left = True, False
            joined.append(w)
        for w in self.workers:
            w.member = (w.role, w.address) in records
        # A joined worker is forgotten once nothing of ours runs there and it either left
        # or is down with no record (an expired record alone is not death).
        self.workers = [w for w in self.workers if not (
            w.joined and w.in_flight == 0 and (w.left or (not w.member and not w.healthy)))]
        return joined

    async def watch_members(self, redis_url: str) -> None:
        """Poll the membership forever; a worker that joins is asked for its Info at once."""
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        from pdmesh.index.membership import read_members

        client = aioredis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        failing = False
        while True:
            try:
                joined = self.sync_members(await read_members(client))
                failing = False
                await asyncio.gather(*(self._refresh(w) for w in joined))
            except (RedisError, OSError) as exc:
                if not failing:
                    log.warning("membership unreadable (%s); keeping the last known workers", exc)
                failing = True
            await asyncio.sleep(self.cfg.membership_interval_s)
