"""Prefill worker: compute a prompt's KV, write it into a decode worker's blocks, return token 1.

Request lifecycle (one ``Prefill`` call):
  1. queued     — the request waits in the engine's scheduler (prefix-cache hits reused);
  2. computing  — prefill chunks run; the last one samples the first token;
  3. held       — the engine keeps the prompt's blocks (``hold_kv``) instead of freeing them;
  4. writing    — NIXL WRITEs the blocks the decode worker lacks into its reservation;
                  full blocks go as soon as their chunk is computed (overlapping the next
                  chunk), the rest once the prompt is done, with the transfer id as the
                  notification; every write is polled against a deadline;
  5. offloaded  — with a kvstore, the prompt's full blocks it lacks are copied there in the
                  background (the response does not wait);
  6. released   — the held blocks are freed (they stay in this worker's prefix cache),
                  whether the writes succeeded, failed or the caller went away.
Before 1, with a kvstore, leading blocks this worker lacks but the store holds are read
into local blocks, so the prefill starts from them instead of recomputing.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from pdmesh.rpc.convert import logprob_to_proto, sampling_from_proto
from pdmesh.serving.worker_core import WorkerCore, remaining
from pdmesh.telemetry import tracing
from pdmesh.telemetry.logging_setup import bind_request
from pdmesh.v1 import worker_pb2, worker_pb2_grpc
from services.prefill.chunk_sender import ChunkSender
from services.prefill.kvstore_tier import KVStoreTier


class PrefillServicer(worker_pb2_grpc.PrefillServicer):
    def __init__(self, core: WorkerCore) -> None:
        self.core = core
        self.tier = KVStoreTier(core, core.cfg.kvstore) if core.cfg.kvstore else None
        self._background: set[asyncio.Task[None]] = set()

    async def Prefill(  # noqa: N802 (gRPC method name)
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        core = self.core
        dest = request.destination
        budget = remaining(context, core.cfg.transfer_timeout_s + 600)
        await core.ensure_peer(dest.worker_id, dest.worker_address, timeout=min(budget, 5.0))
        user = sampling_from_proto(request.sampling)
        params = user.replace(
            max_tokens=1, min_tokens=min(user.min_tokens, 1), stop=(), output_kind="final_only",
            cache_salt=request.cache_salt or None,
        )
        rid = request.request_id
        start = time.perf_counter()
        timer = core.request_metrics.stream()
        ids = list(request.prompt_token_ids)
        span = tracing.start_span("prefill", tracing.incoming(context), request_id=rid,
                                  prompt_tokens=len(ids), destination=dest.worker_id)
        bind_request(rid, span)
        try:
            return await self._prefill(request, context, params, rid, ids, start, timer, span)
        except Exception as exc:
            span.record_exception(exc)
            raise
        finally:
            span.end()

    async def _prefill(self, request, context, params, rid, ids, start, timer, span):  # type: ignore[no-untyped-def]
        core = self.core
        dest = request.destination
        sctx = tracing.child_context(span)
        if self.tier is not None:
            fetch = tracing.start_span("kvstore.fetch", sctx)
            fetched = await self.tier.fetch(ids, params, tracing.child_context(fetch))
            fetch.set_attribute("pdmesh.fetched_tokens", fetched)
            fetch.end()
        final = None
        sender = ChunkSender(core, rid, dest,
                             min(remaining(context, core.cfg.transfer_timeout_s), core.cfg.transfer_timeout_s),
                             span)
        transfer = tracing.start_span("kv_transfer", sctx, peer=dest.worker_id,
                                      first_block=dest.first_block,
                                      bytes_needed=len(dest.block_ids) * core.transport.block_bytes)
        sender.start()
        try:
            async for out in core.aeng.generate(ids, params, rid, hold_kv=True):
                final = out
        except BaseException:
            await sender.stop()
            transfer.end()
            raise
        if final is None or not final.outputs:
            await sender.stop()
            transfer.end()
            raise RuntimeError(f"prefill of {rid} produced no token")
        computed_at = time.perf_counter()
        timer.tokens(1)
        offloading = False
        try:
            total_blocks = -(-len(ids) // core.cfg.block_size)
            try:
                sent_blocks = await sender.finish(total_blocks)
            finally:
                transfer.set_attributes({"pdmesh.bytes": sender.bytes,
                                         "pdmesh.blocks": sender.sent - dest.first_block,
                                         "pdmesh.overlapped_blocks": sender.overlapped_blocks})
                transfer.end()
            moved = sender.bytes
            core.counters.overlapped_blocks += sender.overlapped_blocks
            if self.tier is not None:
                task = asyncio.create_task(self._offload_then_release(rid, sctx))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                offloading = True
        finally:
            if not offloading:
                core.aeng.call(lambda: core.engine.handoff.release(rid))
        done = time.perf_counter()
        comp = final.outputs[0]
        cached = final.metrics.num_cached_tokens
        m = final.metrics
        span.set_attributes({
            "pdmesh.cached_tokens": cached, "pdmesh.computed_tokens": len(ids) - cached,
            "pdmesh.queue_wait_ms": 1000 * ((m.first_scheduled_time or m.arrival_time) - m.arrival_time),
        })
        core.counters.cached_prompt_tokens += cached
        core.counters.computed_prompt_tokens += len(request.prompt_token_ids) - cached
        resp = worker_pb2.PrefillResponse(
            first_token_id=comp.token_ids[0], cached_tokens=cached,
            blocks_transferred=sent_blocks, bytes_transferred=moved,
            prefill_ms=1000 * (computed_at - start), transfer_ms=1000 * (done - computed_at),
        )
        if comp.logprobs:
            resp.first_logprob.CopyFrom(logprob_to_proto(comp.logprobs[0]))
        timer.done("prefilled")
        return resp

    async def _offload_then_release(self, rid: str, ctx) -> None:  # type: ignore[no-untyped-def]
        span = tracing.start_span("kvstore.offload", ctx, request_id=rid)
        try:
            if self.tier is not None:
                await self.tier.offload(rid, tracing.child_context(span))
        finally:
            span.end()
            self.core.aeng.call(lambda: self.core.engine.handoff.release(rid))
