"""Decode worker: reserve blocks, wait for the KV, then stream tokens.

Request lifecycle (the states are the engine sequence's status and one ``Reservation``):
  1. reserved   — ``Reserve`` allocates blocks for the prompt (blocks already cached here
                  are reused, so only the rest is transferred) under a lease; the sequence
                  is WAITING_FOR_REMOTE_KV;
  2. transfer   — a prefill worker WRITEs the KV over NIXL; a reservation not claimed
                  before its lease ends is freed by the lease reaper;
  3. running    — ``Decode`` (sent only once the prefill worker answered, i.e. once its
                  writes are DONE: the KV is here) claims the reservation, commits the
                  first token and the request joins continuous batching; tokens stream
                  back; a caller that goes away aborts it;
  4. finished   — blocks are freed; the prompt's blocks stay as prefix cache.
``GenerateLocal`` skips 1–2: this worker prefills the prompt itself (and, with resume
tokens, continues a request another decode worker lost mid-stream).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from pdmesh.engine.resume import Resume
from pdmesh.mesh_types import KvDestination
from pdmesh.rpc.convert import (
    destination_to_proto,
    logprob_from_proto,
    sampling_from_proto,
)
from pdmesh.rpc.feed_source import FeedQueue, Feeds
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry import tracing
from pdmesh.telemetry.logging_setup import bind_request
from pdmesh.v1 import generate_pb2, worker_pb2, worker_pb2_grpc
from services.decode.relay import Relay
from services.decode.reservations import Reservations
from services.worker.worker import Worker

log = logging.getLogger(__name__)
SERVICE = "pdmesh.v1.Decode"


class DecodeServicer(worker_pb2_grpc.DecodeServicer):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.reservations = Reservations()
        self.feeds = Feeds()

    def _params(self, msg: worker_pb2.ReserveRequest) -> SamplingParams:
        return sampling_from_proto(msg.sampling, output_kind="delta", cache_salt=msg.cache_salt or None)

    # -- reservations -----------------------------------------------------------------
    async def Reserve(self, request: worker_pb2.ReserveRequest, context) -> worker_pb2.KvHandle:  # noqa: N802
        worker = self.worker
        rid = request.request_id
        params = self._params(request)
        await worker.async_engine.prepare(params)
        ids = list(request.prompt_token_ids)
        span = tracing.start_span("decode.reserve", tracing.incoming(context), request_id=rid,
                                  prompt_tokens=len(ids))
        bind_request(rid, span)
        try:
            res = worker.async_engine.call(lambda: worker.engine.handoff.reserve(rid, ids, params))
            span.set_attributes({"pdmesh.blocks": len(res.block_ids), "pdmesh.cached_tokens": res.cached_tokens})
        finally:
            span.end()
        record = self.reservations.add(rid, request.lease_ms or worker.cfg.lease_ms)
        worker.transfers.poller.poke()  # progress at the await rate from now on
        return destination_to_proto(KvDestination(
            worker_id=worker.worker_id, worker_address=worker.address, block_ids=tuple(res.block_ids),
            first_block=res.first_block, cached_tokens=res.cached_tokens, compat_hash=worker.compat,
            lease_expiry_unix_ms=record.lease_expiry_ms, transfer_id=record.transfer_id,
        ))

    async def RenewLease(self, request: worker_pb2.RenewLeaseRequest, context) -> worker_pb2.KvHandle:  # noqa: N802
        record = self.reservations.renew(request.request_id, request.lease_ms or self.worker.cfg.lease_ms)
        return worker_pb2.KvHandle(worker_id=self.worker.worker_id, lease_expiry_unix_ms=record.lease_expiry_ms,
                                   transfer_id=record.transfer_id)

    async def Release(self, request: worker_pb2.ReleaseRequest, context) -> worker_pb2.ReleaseResponse:  # noqa: N802
        if request.HasField("kv_written_inline"):  # KV landed for a request that needs no Decode
            self._landed(request.kv_written_inline)
        return worker_pb2.ReleaseResponse(released=self._release(request.request_id))

    def _landed(self, inline: bool) -> None:
        """A prompt's KV landed here; ``inline``: within its writer's calls."""
        self.reservations.writes.saw(inline)
        if inline:
            self.worker.counters.kv_writes_inline += 1
        else:
            self.worker.counters.kv_writes_polled += 1

    def _release(self, rid: str) -> bool:
        self.reservations.pop(rid)
        return bool(self.worker.async_engine.call(lambda: self.worker.engine.handoff.release(rid)))

    async def reap_leases(self, interval: float = 0.1) -> None:
        """Free reservations whose KV never came (prefill died, router went away)."""
        while True:
            await asyncio.sleep(interval)
            for rid in self.reservations.expired():
                if self._release(rid):
                    self.worker.counters.expired_leases += 1
                    log.warning("reservation %s expired before its Decode came; blocks freed", rid)

    async def drive_transfers(self) -> None:
        """Drive UCX progress for writes into this worker's pool on the transfer poller's
        thread, every 2 ms while a reservation is unclaimed (UCX over TCP moves a peer's
        write only while its target progresses, and a new peer connects only then). It
        never stops: a write whose reservation has lapsed must still complete, not hang
        (the worker closes the poller when it stops)."""
        self.worker.transfers.poller.drive_progress(self.reservations.awaiting_kv)
        await asyncio.Future()  # runs until the worker stops

    # -- generation -------------------------------------------------------------------
    async def Decode(self, request: worker_pb2.DecodeRequest, context) -> AsyncIterator[generate_pb2.GenerateResponse]:  # noqa: N802
        worker = self.worker
        rid = request.request_id
        self.reservations.claim(rid, request.transfer_id)  # Decode owns the blocks from here on
        # Unset: no KV was written, or a writer that does not say; either way no proof that
        # awaiting KV can do without this worker's passes.
        self._landed(request.HasField("kv_written_inline") and request.kv_written_inline)
        span = tracing.start_span("decode", tracing.incoming(context), request_id=rid)
        bind_request(rid, span)
        try:
            lp = logprob_from_proto(request.first_logprob) if request.HasField("first_logprob") else None

            def commit() -> None:
                worker.engine.handoff.commit(rid, request.first_token_id, lp, request.cached_tokens)

            async for resp in self._send(rid, commit, span, request.feed_id, prefills=False):
                yield resp
        finally:
            span.end()
            # A no-op once committed (the stream's own exit aborts a running request);
            # frees the reservation if we never got that far.
            self._release(rid)

    async def GenerateLocal(  # noqa: N802 (gRPC method name)
        self, request: worker_pb2.ReserveRequest, context
    ) -> AsyncIterator[generate_pb2.GenerateResponse]:
        params = self._params(request)
        await self.worker.async_engine.prepare(params)
        span = tracing.start_span("decode.local", tracing.incoming(context), request_id=request.request_id,
                                  prompt_tokens=len(request.prompt_token_ids))
        resume = None
        if request.resume_token_ids:
            resume = Resume(tuple(request.resume_token_ids), request.resume_text_chars)
            span.set_attribute("pdmesh.resumed_tokens", len(resume.token_ids))
        rid, ids = request.request_id or f"local-{uuid.uuid4().hex}", list(request.prompt_token_ids)

        def start() -> None:
            self.worker.engine.add_request(rid, ids, params, resume=resume)

        try:
            # A resumed request's prompt hits are not known here (its tokens are outputs
            # already): its recompute is left out of the prompt counters, not guessed.
            async for resp in self._send(rid, start, span, request.feed_id, prefills=resume is None,
                                         resumed=len(request.resume_token_ids)):
                yield resp
        finally:
            span.end()

    async def Feed(self, request: worker_pb2.FeedRequest, context) -> AsyncIterator[worker_pb2.FeedBatch]:  # noqa: N802
        async for batch in self.feeds.serve(request.feed_id):
            yield batch

    def _feed(self, feed_id: str) -> FeedQueue | None:
        feed = self.feeds.get(feed_id)
        if feed is None and feed_id:
            self.worker.counters.feed_misses += 1
            log.warning("a call named token feed %s, which is not open here: streaming on the call", feed_id)
        return feed

    async def _send(self, rid: str, start: Callable[[], None], span: Any, feed_id: str,
                    prefills: bool, resumed: int = 0) -> AsyncIterator[generate_pb2.GenerateResponse]:
        """Start the request; its messages are yielded on its own call, or pushed onto the
        feed its caller named (then the call ends without a message of its own).
        ``prefills``: this worker computes the prompt (``GenerateLocal``), not a prefill
        worker. ``resumed``: completion tokens streamed by another worker before this one."""
        relay, feed = Relay(self.worker, rid, span, prefills, resumed), self._feed(feed_id)
        async for out in self.worker.async_engine.stream(rid, start):
            if feed is None:
                yield relay(out)
            else:
                feed.push(relay(out))


def add_to_server(server: grpc.aio.Server, worker: Worker) -> DecodeServicer:
    servicer = DecodeServicer(worker)
    worker_pb2_grpc.add_DecodeServicer_to_server(servicer, server)
    return servicer
