"""Prefill worker: compute a prompt's KV, write it into a decode worker's blocks, return token 1.

Request lifecycle (one ``Prefill`` call):
  1. queued     — the request waits in the engine's scheduler (prefix-cache hits reused);
  2. computing  — prefill chunks run; the last one samples the first token;
  3. held       — the sequence ends FINISHED_KV_HELD: the engine keeps the prompt's blocks;
  4. writing    — NIXL WRITEs the blocks the decode worker lacks into its reservation;
                  full blocks go as soon as their chunk is computed (overlapping the next
                  chunk), the rest once the prompt is done; every write is polled
                  against a deadline, and the answer waits until all are DONE (in the
                  decode worker's memory: the router's ``Decode`` that follows says so);
  5. offloaded  — with a kvstore, the prompt's full blocks it lacks are copied there in the
                  background (the response does not wait);
  6. released   — the held blocks are freed (they stay in this worker's prefix cache),
                  whether the writes succeeded, failed or the caller went away.
Before 1, with a kvstore, leading blocks this worker lacks but the store holds are read
into local blocks, so the prefill starts from them instead of recomputing.
``PrefillStream`` (what the router calls) is the same with the destination in a second
message, which arrives during 1-2 (the decode worker reserves meanwhile); 4 waits for it.
It also answers twice: the first token alone at the end of 2, which the router streams to
its caller while 4 runs (the write of a 256-token prompt took ~1 ms of a lone request's
time to first token; docs/performance/log.md §38), then the whole answer after 4.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import grpc

from pdmesh.mesh_types import KvDestination
from pdmesh.request import RequestOutput
from pdmesh.rpc.convert import (
    destination_from_proto,
    logprob_to_proto,
    sampling_from_proto,
)
from pdmesh.rpc.prefill_stream import Early, serve_stream
from pdmesh.rpc.process import remaining
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry import tracing
from pdmesh.telemetry.logging_setup import bind_request
from pdmesh.v1 import worker_pb2, worker_pb2_grpc
from services.prefill.chunk_sender import ChunkSender
from services.prefill.kvstore_tier import KVStoreTier
from services.worker.worker import Worker

SERVICE = "pdmesh.v1.Prefill"


@dataclass(slots=True)
class PrefillJob:
    """One ``Prefill`` call, converted from the wire once."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    """The user's params cut down to one token (no stop strings, final output only)."""
    destination: asyncio.Future[KvDestination]
    """Known when the call starts (``Prefill``) or once its second message came (``PrefillStream``)."""
    transfer_timeout_s: float
    span: Any
    started: float = 0.0
    user_stops: bool = False
    """The user asked for stop strings: the first token's text may be held back by the
    decode worker's detokenizer, so it is not rendered here."""
    listed: dict[str, int] | None = None
    """The router's index view (``PrefillRequest.index_view``): leading prompt blocks per
    holder beyond the prefill workers; None when the router did not read the index."""
    early: Early | None = None
    """Sends the first token before the KV write (``PrefillStream``); None: one answer."""


class PrefillServicer(worker_pb2_grpc.PrefillServicer):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.tier = KVStoreTier(worker, worker.cfg.kvstore) if worker.cfg.kvstore else None
        self._background: set[asyncio.Task[None]] = set()

    async def Prefill(  # noqa: N802 (gRPC method name)
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        destination: asyncio.Future[KvDestination] = asyncio.get_running_loop().create_future()
        destination.set_result(destination_from_proto(request.destination))
        return await self._prefill(request, context, destination)

    async def PrefillStream(  # noqa: N802 (gRPC method name)
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> None:
        """The router's hand-off: its protocol is ``pdmesh/rpc/prefill_stream.py``."""
        await serve_stream(context, self._prefill)

    async def _prefill(self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext,
                       destination: asyncio.Future[KvDestination],
                       early: Early | None = None,
                       ) -> worker_pb2.PrefillResponse:
        worker = self.worker
        user = sampling_from_proto(request.sampling)
        params = user.replace(
            max_tokens=1, min_tokens=min(user.min_tokens, 1), stop=(), output_kind="final_only",
            cache_salt=request.cache_salt or None,
        )
        rid = request.request_id
        ids = list(request.prompt_token_ids)
        span = tracing.start_span("prefill", tracing.incoming(context), request_id=rid, prompt_tokens=len(ids))
        bind_request(rid, span)
        job = PrefillJob(rid, ids, params, destination,
                         min(remaining(context, worker.cfg.transfer_timeout_s), worker.cfg.transfer_timeout_s),
                         span, time.perf_counter(), user_stops=bool(user.stop),
                         listed=dict(request.index_view.tier_blocks) if request.HasField("index_view") else None,
                         early=early)
        try:
            return await self._run(job)
        except Exception as exc:
            span.record_exception(exc)
            raise
        finally:
            span.end()

    async def _run(self, job: PrefillJob) -> worker_pb2.PrefillResponse:
        worker = self.worker
        sctx = tracing.child_context(job.span)
        timer = worker.request_metrics.stream()
        if self.tier is not None:
            fetch = tracing.start_span("kvstore.fetch", sctx)
            fetched = await self.tier.fetch(job.prompt, job.params, job.listed, tracing.child_context(fetch))
            fetch.set_attribute("pdmesh.fetched_tokens", fetched)
            fetch.end()
        sender = ChunkSender(worker, job.request_id, job.destination, job.transfer_timeout_s, job.span)
        transfer = tracing.start_span("kv_transfer", sctx)
        final = await self._compute(job, sender, transfer)
        computed_at = time.perf_counter()
        timer.tokens(1)
        offloading = False
        try:
            try:
                if job.early is not None:
                    await job.early(self._first_token(job, final, computed_at, first_only=True))
                sent_blocks = await sender.finish(-(-len(job.prompt) // worker.cfg.block_size))
            finally:
                await sender.stop()  # done already after finish; after a failed early answer, the writes stop
                dest = sender.dest
                if dest is not None:
                    transfer.set_attributes({
                        "pdmesh.peer": dest.worker_id, "pdmesh.first_block": dest.first_block,
                        "pdmesh.bytes_needed": len(dest.block_ids) * worker.transport.block_bytes,
                        "pdmesh.bytes": sender.bytes, "pdmesh.blocks": sender.sent - dest.first_block,
                        "pdmesh.overlapped_blocks": sender.overlapped_blocks})
                    job.span.set_attribute("pdmesh.destination", dest.worker_id)
                transfer.end()
            worker.counters.overlapped_blocks += sender.overlapped_blocks
            if self.tier is not None:
                task = asyncio.create_task(self._offload_then_release(job.request_id, sctx))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                offloading = True
        finally:
            if not offloading:
                worker.async_engine.call(lambda: worker.engine.handoff.release(job.request_id))
        timer.done("prefilled")
        return self._response(job, final, sent_blocks, sender.bytes, computed_at, sender.inline)

    async def _compute(self, job: PrefillJob, sender: ChunkSender, transfer: Any) -> RequestOutput:
        """Run the prompt with its KV held, sending finished blocks while later chunks run."""
        final = None
        sender.start()
        try:
            async for out in self.worker.async_engine.generate(job.prompt, job.params, job.request_id, hold_kv=True):
                final = out
        except BaseException:
            await sender.stop()
            transfer.end()
            raise
        if final is None or not final.outputs:
            await sender.stop()
            transfer.end()
            raise RuntimeError(f"prefill of {job.request_id} produced no token")
        return final

    def _first_token(self, job: PrefillJob, final: RequestOutput, computed_at: float,
                     first_only: bool = False) -> worker_pb2.PrefillResponse:
        """The answer's first-token fields: all ``PrefillStream``'s first message carries."""
        comp = final.outputs[0]
        resp = worker_pb2.PrefillResponse(
            first_token_id=comp.token_ids[0], cached_tokens=final.metrics.num_cached_tokens,
            prefill_ms=1000 * (computed_at - job.started),
            first_stopped=comp.finish_reason == "stop",  # EOS or a stop token: max_tokens is 1
            first_only=first_only,
        )
        if not job.user_stops:
            resp.first_text = comp.text
        if comp.logprobs:
            resp.first_logprob.CopyFrom(logprob_to_proto(comp.logprobs[0]))
        if final.prompt_logprobs:
            resp.prompt_logprobs.extend(logprob_to_proto(lp) for lp in final.prompt_logprobs)
        return resp

    def _response(self, job: PrefillJob, final: RequestOutput, sent_blocks: int, moved: int,
                  computed_at: float, inline: bool | None) -> worker_pb2.PrefillResponse:
        worker = self.worker
        cached = final.metrics.num_cached_tokens
        m = final.metrics
        job.span.set_attributes({
            "pdmesh.cached_tokens": cached, "pdmesh.computed_tokens": len(job.prompt) - cached,
            "pdmesh.queue_wait_ms": 1000 * ((m.first_scheduled_time or m.arrival_time) - m.arrival_time),
        })
        worker.counters.cached_prompt_tokens += cached
        worker.counters.computed_prompt_tokens += len(job.prompt) - cached
        resp = self._first_token(job, final, computed_at)
        resp.blocks_transferred, resp.bytes_transferred = sent_blocks, moved
        resp.transfer_ms = 1000 * (time.perf_counter() - computed_at)
        if inline is not None:
            resp.kv_written_inline = inline
        return resp

    async def _offload_then_release(self, rid: str, ctx) -> None:
        span = tracing.start_span("kvstore.offload", ctx, request_id=rid)
        try:
            if self.tier is not None:
                await self.tier.offload(rid, tracing.child_context(span))
        finally:
            span.end()
            self.worker.async_engine.call(lambda: self.worker.engine.handoff.release(rid))


def add_to_server(server: grpc.aio.Server, worker: Worker) -> PrefillServicer:
    servicer = PrefillServicer(worker)
    worker_pb2_grpc.add_PrefillServicer_to_server(servicer, server)
    return servicer
