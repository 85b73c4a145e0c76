"""The engine, its async loop and its NIXL transport inside one worker process.

Shared by the prefill and decode servicers: builds the engine from ``WorkerConfig``,
registers the KV pool with NIXL, describes itself (``info``), connects to peers on demand
and runs KV transfers against a deadline, counting what moved.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid

from prometheus_client import CollectorRegistry

from pdmesh.engine.async_engine import AsyncLLMEngine
from pdmesh.engine.compute_thread import build_on_passing_thread
from pdmesh.engine.core_share import CoreShare, parse_spec
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.step_cost import TokenCost
from pdmesh.engine.warm_up import warm_up
from pdmesh.errors import IncompatibleWorkerError, TransferFailedError
from pdmesh.kv.layout import KVLayout
from pdmesh.kv.transfer.base import KVRegion, KVTransport, PeerLayout
from pdmesh.kv.transfer.copy_priority import CopyPriority, copy_priority
from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.kv.transfer.runner import Moved, TransferRunner
from pdmesh.mesh_types import WorkerInfo
from pdmesh.model.source import identity_name
from pdmesh.rpc.clients import fetch_info
from pdmesh.rpc.process import advertised
from pdmesh.rpc.single_flight import SingleFlight
from pdmesh.telemetry.metrics import RequestMetrics, SnapshotCollector
from services.worker.config import WorkerConfig
from services.worker.counters import Counters
from services.worker.metrics import worker_snapshot


def _transport(name: str, region: KVRegion) -> KVTransport:
    transport: KVTransport = NixlTransport(name, region)
    if any(k.startswith("PDMESH_FAULT_TRANSFER_") for k in os.environ):  # tests only
        from pdmesh.kv.transfer.faults import fault_wrapped

        transport = fault_wrapped(transport)
    return transport


def _copy_priority(cfg: WorkerConfig, region: KVRegion) -> CopyPriority:
    priority = copy_priority(cfg.kv_copy_priority)
    # Between GPUs a copy is the DMA engine's: only host memory is copied by the calling thread.
    loud = cfg.kv_copy_priority == "realtime" and not priority.realtime and region.mem_type == "DRAM"
    logging.getLogger(__name__).log(logging.WARNING if loud else logging.INFO, priority.detail)
    return priority


def _device_text(device: str) -> str:
    """The device as Info shows it, with the GPUs this process was given."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    name = "cuda:0" if device == "cuda" else device
    return f"{name} (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else name


WARM_READS = 4
"""Most one-block reads a new peer's connection is warmed with (``Worker._warm``)."""


def _warmed(engine: LLMEngine, tokens: int) -> LLMEngine:
    done = warm_up(engine, tokens)
    if done is not None:
        logging.getLogger(__name__).info(
            "warmed up: a %d-token prompt and a decode step in %.2fs (%d page faults)",
            done.prompt_tokens, done.seconds, done.page_faults)
    return engine


def _core_share(cfg: WorkerConfig) -> CoreShare:
    if not cfg.threads:
        raise ValueError("--core-share needs --threads (this worker's own share of the cores)")
    path, slot = parse_spec(cfg.core_share)
    share = CoreShare(path, slot, cfg.threads, os.cpu_count() or cfg.threads)
    logging.getLogger(__name__).info(
        "cores: %d of %d own, idle workers' cores borrowed per step (%s slot %d)",
        cfg.threads, share.total, path, slot)
    return share


class Worker:
    """A worker's engine, NIXL transport and counters. Built in two steps: the identity
    first (the server is bound and answers health while the model loads), then ``load``,
    before which the readiness gate lets no call reach a servicer."""

    engine: LLMEngine
    async_engine: AsyncLLMEngine
    transport: KVTransport
    transfers: TransferRunner
    dtype_name: str
    compat: str
    """Set by ``load``."""

    def __init__(self, cfg: WorkerConfig, port: int) -> None:
        self.cfg = cfg
        self.port = port
        self.worker_id = cfg.resolved_id(port)
        self.address = advertised(cfg.advertise_address, cfg.host, port)
        self.epoch = uuid.uuid4().hex[:12]
        self.device = _device_text(cfg.device)
        self.counters = Counters()
        self.kvstore_cost = TokenCost(min_tokens=1)
        """Seconds per prompt token fetched from the kvstore (lookup + read), advertised."""
        self.metrics = CollectorRegistry()
        self.request_metrics = RequestMetrics(self.metrics, cfg.role)
        self._connects: SingleFlight[None] = SingleFlight()
        """One NIXL connection attempt per peer at a time (``ensure_peer``)."""
        self._warmed: set[tuple[str, str]] = set()
        """Peers (id, epoch) whose connection a read warmed (``_warm``): once per start of
        each, a failed read too."""

    def load(self) -> None:
        """Build the engine (weights, kernels, plan, KV pool, warm-up) and register its pool
        with NIXL. Blocking for as long as that takes: call it off the event loop."""
        cfg = self.cfg
        # Not on the event loop's thread: the engine thread must be the process's only
        # OpenMP pool (compute_thread.py).
        self.engine = build_on_passing_thread(lambda: _warmed(LLMEngine(cfg.engine_config()), cfg.warmup_tokens))
        self.async_engine = AsyncLLMEngine(self.engine)
        if cfg.core_share:
            self.async_engine.core_share = _core_share(cfg)
        region = KVRegion.of_tensor(self.engine.runner.kv_cache)
        self.transport = _transport(self.worker_id, region)
        self.transfers = TransferRunner(self.transport, _copy_priority(cfg, region))
        self.dtype_name = str(self.engine.dtype).split(".")[-1]
        layout = KVLayout.for_model(self.engine.model_config, cfg.block_size, self.dtype_name)
        self.compat = layout.compat_hash(cfg.model, cfg.hash_algorithm, cfg.hash_seed)
        self.metrics.register(SnapshotCollector(lambda: self.async_engine.call(lambda: worker_snapshot(self))))

    def info(self) -> WorkerInfo:
        """Call under the engine lock (``async_engine.call``)."""
        eng, c, t = self.engine, self.counters, self.transport
        stats = eng.pool.stats()
        return WorkerInfo(
            worker_id=self.worker_id, role=self.cfg.role, model=identity_name(self.cfg.model),
            dtype=self.dtype_name, block_size=self.cfg.block_size,
            hash_algorithm=self.cfg.hash_algorithm, hash_seed=self.cfg.hash_seed,
            num_blocks=stats.num_blocks, free_blocks=eng.pool.num_free_blocks,
            num_running=len(eng.scheduler.running), num_waiting=eng.scheduler.num_waiting,
            nixl_metadata=t.metadata(), kv_base_addr=t.region.base_addr,
            kv_block_bytes=t.block_bytes, epoch=self.epoch, compat_hash=self.compat,
            kv_mem_type=t.region.mem_type, kv_device_id=t.region.device_id,
            used_blocks=stats.used, cached_blocks=stats.cached, num_handoffs=eng.handoff.count,
            computed_prompt_tokens=c.computed_prompt_tokens, cached_prompt_tokens=c.cached_prompt_tokens,
            kv_bytes_sent=c.kv_bytes_sent, expired_leases=c.expired_leases,
            kv_transfer_seconds=self.transfers.writing.seconds, kvstore_fetched_tokens=c.kvstore_fetched_tokens,
            kvstore_offloaded_blocks=c.kvstore_offloaded_blocks, overlapped_blocks=c.overlapped_blocks,
            queued_prefill_tokens=eng.scheduler.pending_prompt_tokens,
            prefill_us_per_token=1e6 * eng.prefill_cost.s_per_token,
            kvstore_us_per_token=1e6 * self.kvstore_cost.s_per_token,
            max_num_seqs=eng.scheduler.config.max_num_seqs, max_model_len=eng.max_model_len,
            device=self.device,
        )

    # -- KV transfer ------------------------------------------------------------------
    async def ensure_peer(self, worker_id: str, address: str, timeout: float, kvstore: bool = False) -> None:
        """Connect NIXL to a decode worker or the kvstore the first time (or after a restart).
        Concurrent requests for one peer share one connection attempt: registering a peer
        again would invalidate transfers to it already under way.

        Returns with the peer registered as of its last check, after the last await, so a
        caller that starts its write without awaiting writes to a registered peer. Between
        a shared connection landing and this caller resuming, another request's failed
        write may drop the peer again (``TransferRunner``); without the check again, every
        request waiting on that connection failed its write too (six failures for two in
        a CI run of tests/integration/failover/test_transfer_failure.py)."""
        deadline = time.monotonic() + timeout
        while not self.connected(worker_id):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransferFailedError(f"NIXL connection to {worker_id} was dropped again within {timeout:.1f}s")
            # The margin lets the call's own deadline error (with its gRPC status) arrive first.
            await self._connects.run(worker_id, functools.partial(self._connect, worker_id, address, left, kvstore),
                                     left + 0.5)

    def connected(self, worker_id: str) -> bool:
        """The peer is registered and no connection attempt to it is in flight: one may
        have registered it already and still be warming it (``_warm``), and a transfer
        started then would take UCX's handshake itself."""
        return self.transport.has_peer(worker_id) and not self._connects.busy(worker_id)

    async def _connect(self, worker_id: str, address: str, timeout: float, kvstore: bool) -> None:
        if self.transport.has_peer(worker_id):
            return
        deadline = time.monotonic() + timeout
        info = await fetch_info(address, timeout, kvstore)
        if info.compat_hash != self.compat:
            raise IncompatibleWorkerError(
                f"{info.worker_id} has compat {info.compat_hash}, this prefill worker {self.compat}"
            )
        self.transport.add_peer(PeerLayout(
            info.worker_id, info.nixl_metadata, info.kv_base_addr, info.kv_block_bytes,
            info.num_blocks, info.kv_mem_type or "DRAM", info.kv_device_id,
        ))
        if (worker_id, info.epoch) not in self._warmed:
            self._warmed.add((worker_id, info.epoch))
            await self._warm(worker_id, deadline - time.monotonic())

    async def _warm(self, peer: str, timeout: float) -> None:
        """Read one of a new peer's blocks into a spare local one, so that UCX connects now.

        A first transfer between two agents waits for UCX's connection handshake, which
        needs the peer's progress passes: over shared memory a first 4 MiB write took
        120-170 ms against a peer polling at the idle rate, later ones under 1 ms within
        the writer's call. A request's first write to a decode worker then lands only
        when the decode worker polls, and that worker polls every awaited reservation for
        ``TRUST_S`` after (``services/decode/write_path.py``). One block read from the
        peer (harmless there: nothing of its changes) takes the handshake instead, while
        the prompt still computes; the first write then lands within its call. A failed
        read is the first write's to report: logged, not raised (the runner drops the
        peer when the read failed, not when it ran past its deadline, and ``ensure_peer``
        then connects once more without warming it). The spare block comes from the pool
        as a kvstore import's do, so a full pool may give up one cached block for it.

        The handshake's read is never inline, and the transfer right after it was not
        either in 4 of 30 fresh 1 + 1 meshes on 2 loaded cores (the first write then
        waited for the poller: CI failed so once): the connection counts as warm once a
        read lands within its call, so it reads again until one does, ``WARM_READS`` at
        most (over TCP none does)."""
        eng = self.engine
        blocks = self.async_engine.call(lambda: eng.handoff.import_start(1))
        if not blocks:
            return  # no spare block: the first write connects instead
        started = time.perf_counter()
        deadline = time.monotonic() + timeout
        try:
            for reads in range(1, WARM_READS + 1):  # noqa: B007 - the count is logged after the loop
                moved = await self.transfers.read(peer, [blocks[0].block_id], [0], deadline - time.monotonic())
                if moved.inline or time.monotonic() >= deadline:
                    break
        except TransferFailedError as exc:
            logging.getLogger(__name__).warning("warming the NIXL connection to %s failed: %s", peer, exc)
        else:
            logging.getLogger(__name__).info(
                "NIXL connection to %s warmed by one-block reads in %.1f ms (%d, the last %s)",
                peer, 1e3 * (time.perf_counter() - started), reads, "inline" if moved.inline else "polled")
        finally:
            self.async_engine.call(lambda: eng.handoff.import_finish(blocks, [], [], None, ok=False))

    async def write_kv(self, peer: str, src: list[int], dst: list[int], timeout: float) -> Moved:
        """Write local blocks into a decode worker's (bytes counted once they landed, also
        those of a write whose waiter was cancelled)."""
        return await self.transfers.write(peer, src, dst, timeout, landed=self._sent)

    def _sent(self, nbytes: int) -> None:
        self.counters.kv_bytes_sent += nbytes
