"""The engine, its async loop and its NIXL transport inside one worker process.

Shared by the prefill and decode servicers: builds the engine from ``WorkerConfig``,
registers the KV pool with NIXL, answers ``Info``, connects to peers on demand and runs
KV writes against a deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from pdmesh.config import CacheConfig, EngineConfig, SchedulerConfig
from pdmesh.engine.async_engine import AsyncLLMEngine
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.kv.transfer.base import PeerLayout, TransferState
from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.rpc.status import TransferFailedError
from pdmesh.errors import IncompatibleWorkerError
from pdmesh.serving.clients import kvstore_stub, worker_stub
from pdmesh.serving.worker_config import WorkerConfig
from pdmesh.telemetry.metrics import RequestMetrics, SnapshotCollector
from pdmesh.v1 import worker_pb2

log = logging.getLogger(__name__)
_ROLES = {"prefill": worker_pb2.WORKER_ROLE_PREFILL, "decode": worker_pb2.WORKER_ROLE_DECODE}


@dataclass
class Counters:
    kv_bytes_sent: int = 0
    kv_transfer_seconds: float = 0.0
    kvstore_fetched_tokens: int = 0
    kvstore_offloaded_blocks: int = 0
    overlapped_blocks: int = 0
    expired_leases: int = 0
    computed_prompt_tokens: int = 0
    cached_prompt_tokens: int = 0


def compat_hash(model: str, dtype: str, block_size: int, algorithm: str, seed: int,
                layout: tuple[int, ...]) -> str:
    """Digest of what two workers must share to exchange KV blocks and hashes."""
    blob = json.dumps([Path(model).name, dtype, block_size, algorithm, seed, list(layout)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class WorkerCore:
    def __init__(self, cfg: WorkerConfig, port: int) -> None:
        self.cfg = cfg
        self.port = port
        self.worker_id = cfg.resolved_id(port)
        self.address = advertised(cfg.advertise_address, cfg.host, port)
        self.epoch = uuid.uuid4().hex[:12]
        self.engine = LLMEngine(EngineConfig(
            model=cfg.model, dtype=cfg.dtype, device=cfg.device,
            max_model_len=cfg.max_model_len or None, num_threads=cfg.threads or None,
            cache=CacheConfig(
                block_size=cfg.block_size, num_blocks=cfg.num_blocks or None,
                kv_cache_memory_gb=cfg.kv_cache_memory_gb, hash_seed=cfg.hash_seed,
                hash_algorithm=cfg.hash_algorithm,
            ),
            scheduler=SchedulerConfig(cfg.max_num_batched_tokens, cfg.max_num_seqs),
        ))
        self.aeng = AsyncLLMEngine(self.engine)
        kv = self.engine.runner.kv_cache
        self.transport = NixlTransport(self.worker_id, kv)
        delay = os.environ.get("PDMESH_FAULT_TRANSFER_DELAY_S")
        if delay:
            from pdmesh.kv.transfer.faults import DelayedWrites

            log.warning("FAULT INJECTION: every KV write starts %ss late", delay)
            self.transport = DelayedWrites(self.transport, float(delay))  # type: ignore[assignment]
        self.dtype_name = str(self.engine.dtype).split(".")[-1]
        self.compat = compat_hash(
            cfg.model, self.dtype_name, cfg.block_size, cfg.hash_algorithm, cfg.hash_seed,
            tuple(kv.shape[1:]),
        )
        self.counters = Counters()
        self.registry = CollectorRegistry()
        self.request_metrics = RequestMetrics(self.registry, cfg.role)
        self.registry.register(SnapshotCollector(lambda: self.aeng.call(self._metric_snapshot)))

    def _metric_snapshot(self) -> list[tuple[str, str, str, float, dict[str, str]]]:
        eng, c = self.engine, self.counters
        s = eng.pool.stats()
        role = {"role": self.cfg.role}
        prompt = c.cached_prompt_tokens + c.computed_prompt_tokens
        return [
            ("gauge", "pdmesh_kv_blocks", "KV blocks by state", s.used, {**role, "state": "used"}),
            ("gauge", "pdmesh_kv_blocks", "KV blocks by state", s.free, {**role, "state": "free"}),
            ("gauge", "pdmesh_kv_blocks", "KV blocks by state", s.cached, {**role, "state": "cached"}),
            ("gauge", "pdmesh_orphan_kv_blocks", "Blocks in use owned by no live request (a leak if > 0)",
             eng.orphan_blocks(), role),
            ("gauge", "pdmesh_queue_depth", "Requests waiting for admission", eng.scheduler.num_waiting, role),
            ("gauge", "pdmesh_running_requests", "Requests running", len(eng.scheduler.running), role),
            ("gauge", "pdmesh_kv_handoffs", "Reservations awaiting KV / KV held for a write",
             len(eng.handoff.reserved) + len(eng.handoff.held), role),
            ("counter", "pdmesh_prompt_tokens", "Prompt tokens by source", c.computed_prompt_tokens,
             {**role, "source": "computed"}),
            ("counter", "pdmesh_prompt_tokens", "Prompt tokens by source", c.cached_prompt_tokens,
             {**role, "source": "cached"}),
            ("counter", "pdmesh_prompt_tokens", "Prompt tokens by source", c.kvstore_fetched_tokens,
             {**role, "source": "kvstore"}),
            ("gauge", "pdmesh_prefix_cache_hit_rate", "Cached / all prompt tokens since start",
             c.cached_prompt_tokens / prompt if prompt else 0.0, role),
            ("counter", "pdmesh_kv_transfer_bytes", "KV bytes written to decode workers", c.kv_bytes_sent, role),
            ("counter", "pdmesh_kv_transfer_seconds", "Time spent in KV writes", c.kv_transfer_seconds, role),
            ("counter", "pdmesh_kv_overlapped_blocks", "Blocks sent while later chunks computed",
             c.overlapped_blocks, role),
            ("counter", "pdmesh_expired_leases", "Reservations freed because their KV never came",
             c.expired_leases, role),
        ]

    # -- Info -------------------------------------------------------------------------
    def info(self) -> worker_pb2.WorkerInfo:
        eng = self.engine
        stats = eng.pool.stats()
        return worker_pb2.WorkerInfo(
            worker_id=self.worker_id, role=_ROLES[self.cfg.role], model=Path(self.cfg.model).name,
            dtype=self.dtype_name, block_size=self.cfg.block_size,
            hash_algorithm=self.cfg.hash_algorithm, hash_seed=self.cfg.hash_seed,
            num_blocks=stats.num_blocks, free_blocks=eng.pool.num_free_blocks,
            num_running=len(eng.scheduler.running), num_waiting=eng.scheduler.num_waiting,
            nixl_metadata=self.transport.metadata(), kv_base_addr=self.transport.base_addr,
            kv_block_bytes=self.transport.block_bytes, epoch=self.epoch, compat_hash=self.compat,
            kv_mem_type=self.transport.mem_type, kv_device_id=self.transport.device_id,
            used_blocks=stats.used, cached_blocks=stats.cached,
            num_handoffs=len(eng.handoff.reserved) + len(eng.handoff.held),
            computed_prompt_tokens=self.counters.computed_prompt_tokens,
            cached_prompt_tokens=self.counters.cached_prompt_tokens,
            kv_bytes_sent=self.counters.kv_bytes_sent, expired_leases=self.counters.expired_leases,
            kv_transfer_seconds=self.counters.kv_transfer_seconds,
            kvstore_fetched_tokens=self.counters.kvstore_fetched_tokens,
            kvstore_offloaded_blocks=self.counters.kvstore_offloaded_blocks,
            overlapped_blocks=self.counters.overlapped_blocks,
        )

    # -- KV transfer ------------------------------------------------------------------
    async def ensure_peer(self, worker_id: str, address: str, timeout: float, kvstore: bool = False) -> None:
        """Connect NIXL to a decode worker or the kvstore the first time (or after a restart)."""
        if self.transport.has_peer(worker_id):
            return
        stub = kvstore_stub(address) if kvstore else worker_stub(address)
        info = await stub.Info(worker_pb2.InfoRequest(), timeout=timeout)
        if info.compat_hash != self.compat:
            raise IncompatibleWorkerError(
                f"{info.worker_id} has compat {info.compat_hash}, this prefill worker {self.compat}"
            )
        self.transport.add_peer(PeerLayout(
            info.worker_id, info.nixl_metadata, info.kv_base_addr, info.kv_block_bytes,
            info.num_blocks, info.kv_mem_type or "DRAM", info.kv_device_id,
        ))

    async def write_kv(self, peer: str, src: list[int], dst: list[int], notif: bytes,
                       timeout: float) -> int:
        """Write local blocks into ``peer``'s and wait until DONE; returns bytes moved."""
        started = time.perf_counter()
        moved = await self._transfer(peer, lambda: self.transport.write(peer, src, dst, notif),
                                     len(src), timeout, "write")
        self.counters.kv_bytes_sent += moved
        self.counters.kv_transfer_seconds += time.perf_counter() - started
        return moved

    async def write_kv_untracked(self, peer: str, src: list[int], dst: list[int], timeout: float) -> int:
        """A write that is not decode-bound KV (kvstore offload): not in the transfer counters."""
        return await self._transfer(peer, lambda: self.transport.write(peer, src, dst, b""),
                                    len(src), timeout, "offload")

    async def read_kv(self, peer: str, local: list[int], remote: list[int], timeout: float) -> int:
        """Read ``peer``'s blocks into local blocks and wait until DONE; returns bytes moved."""
        return await self._transfer(peer, lambda: self.transport.read(peer, local, remote),
                                    len(local), timeout, "read")

    async def _transfer(self, peer: str, start, blocks: int, timeout: float, what: str) -> int:  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        try:
            handle = start()
        except Exception as exc:
            self.transport.remove_peer(peer)
            raise TransferFailedError(f"KV {what} with {peer} could not start: {exc}") from exc
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    state = self.transport.poll(handle)
                except Exception as exc:
                    state = TransferState.FAILED
                    log.warning("KV %s with %s failed: %s", what, peer, exc)
                if state is TransferState.DONE:
                    return blocks * self.transport.block_bytes
                if state is TransferState.FAILED:
                    self.transport.remove_peer(peer)
                    raise TransferFailedError(f"KV {what} with {peer} failed (peer gone?)")
                if loop.time() > deadline:
                    raise TransferFailedError(f"KV {what} with {peer} did not finish within {timeout:.1f}s")
                await asyncio.sleep(0.0005)
        finally:
            self.transport.release(handle)


def advertised(explicit: str, host: str, port: int) -> str:
    """The address other processes should dial to reach a server bound to host:port."""
    if explicit:
        return explicit
    if host in ("0.0.0.0", "::", "[::]", ""):
        return f"{socket.gethostname()}:{port}"
    return f"{host}:{port}"


def write_port_file(path: str, port: int) -> None:
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(path)


def now_ms() -> int:
    return int(time.time() * 1000)


def remaining(context: grpc.aio.ServicerContext, default: float) -> float:
    """Seconds left on the caller's deadline (``default`` when it set none)."""
    left = context.time_remaining()
    return default if left is None else max(0.0, left)
