"""One request's way through the mesh, as one object that owns its downstream calls.

Lifecycle (the methods below, in this order):
  1. route    — decode worker by load; prefill worker by policy over the Redis index
                (consistent hashing when Redis is down); ``Router.local_reason`` says
                when the decode worker prefills instead (``GenerateLocal``);
  2. reserve  — the decode worker reserves blocks for what it does not cache (a KvHandle);
  3. prefill  — the prefill worker computes the prompt and answers the first token, streamed
                at once where its text is certain (first_token.py), then WRITEs the KV
                and answers again; one that is unreachable (marked down) or breaks the
                call (probed) is left for another; once the first token was streamed, the
                decode worker continues the request by itself instead (``_continue``);
  4. decode   — the decode worker's messages are relayed (over its token feed when open:
                ``pdmesh/rpc/feed_sink.py``); if that worker fails mid-stream,
                another continues from the tokens already streamed (``GenerateLocal`` with
                resume tokens): no gap, no repeat (at most ``max_migrations`` times);
  5. release  — in-flight counts drop; a caller that leaves, or ``abort()``, cancels the
                current call, and every worker frees the request's blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from pdmesh.errors import UnavailableError
from pdmesh.rpc import messages
from pdmesh.rpc.status import WORKER_FAILED
from pdmesh.telemetry import tracing
from services.router import stalls
from services.router.request import first_token, handoff
from services.router.request.caller_stream import caller_stream
from services.router.request.state import RequestState
from services.router.worker_handle import WorkerHandle

PREFILL_ATTEMPTS = 3
"""Routing attempts before the stream starts: a prefill worker that is unreachable or
breaks the call, or a decode worker that does either, is full or loses the KV write, sends
the request to another (the only decode worker: to it again)."""
MIGRATE_ON = WORKER_FAILED | {grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND}
"""Decode stream failures that move the request to another decode worker (the worker
died, drained, lost its KV, or no longer holds the reservation: its lease ran out while
the worker was stopped); the caller's own cancel never reaches here as one of them."""


class RequestFlow(RequestState):
    """A request's way through the mesh: the lifecycle above over its ``RequestState``."""

    # -- the stream the caller sees ---------------------------------------------------
    def stream(self) -> AsyncIterator[Any]:
        """``run`` as the caller sees it, with telemetry and the abort contract (caller_stream.py)."""
        return caller_stream(self, self.run())

    # -- the lifecycle ----------------------------------------------------------------
    async def run(self) -> AsyncIterator[Any]:
        self.hashes = self.router.prompt_hashes(self.prompt, self.params)
        self.decode, self.decode_held = self.router.route_decode(self.hashes, tokens=self.kv_tokens)
        self.decode.acquire()
        try:
            for attempt in range(PREFILL_ATTEMPTS):
                self.attempt = attempt
                local = await self.route()
                if local:
                    async for resp in self._local():
                        yield resp
                    return
                handoff_ = await self.reserve_and_prefill()
                if handoff_ is not None:
                    async for resp in self.decode_stream(handoff_):
                        yield resp
                    return
            raise UnavailableError(
                f"no worker took the request in {PREFILL_ATTEMPTS} attempts (prefill workers that "
                f"failed: {sorted(self.tried)}, decode: {sorted(self.failed_decode)}); retry later")
        finally:
            self.decode.release()

    async def route(self) -> str:
        """Choose the prefill worker; returns the reason to prefill locally ("" = don't)."""
        router, decode = self.router, self.decode_worker()
        span = tracing.start_span("router.route", self.trace, decode=decode.worker_id,
                                  candidates=len(router.workers.healthy("prefill")))
        choice, seen = await router.route_prefill(self.prompt, self.hashes, self.tried, tracing.child_context(span))
        self.outside = seen.outside
        reason = router.local_reason(choice, self.prompt, self.decode_held, decode)
        span.set_attributes({
            "pdmesh.policy": router.prefill_router.policy.name,
            "pdmesh.prefill": choice.worker.worker_id if choice else "",
            "pdmesh.reason": choice.reason if choice else "",
            "pdmesh.cached_prefix_tokens": choice.cached_tokens if choice else 0,
            "pdmesh.fallback": reason,
        })
        span.end()
        self.prefill = choice
        router.settle_route(choice, reason, self.hashes)
        return reason

    async def _local(self) -> AsyncIterator[Any]:
        """Prefill and decode on the decode worker, its prompt work counted there until the
        first token (what the busy rule weighs against the prefill worker's queue)."""
        decode, work = self.decode_worker(), max(0, len(self.prompt) - self.decode_held)
        decode.pending_tokens += work
        try:
            async for resp in self._decoded(self._decode_call("GenerateLocal", self.reserve_msg())):
                decode.pending_tokens -= work
                work = 0
                yield resp
        finally:
            decode.pending_tokens -= work

    async def reserve_and_prefill(self) -> handoff.Handoff | None:
        """Prefill on the chosen worker into a reservation on the decode worker, until its
        first token; None to try again (``services/router/request/handoff.py``)."""
        return await handoff.reserve_and_prefill(self)

    async def decode_stream(self, h: handoff.Handoff) -> AsyncIterator[Any]:
        """The first token straight from the prefill worker where its text is certain
        (``first_token``), while its KV is written; then the decode worker's stream once
        the KV landed, no ``Decode`` at all when that token ends the request."""
        self.prompt_logprobs = list(h.first.prompt_logprobs)
        relayed = first_token.early(h.first, self.params, len(self.prompt),
                                    max(h.handle.cached_tokens, h.first.cached_tokens))
        try:
            if relayed is not None:
                self._streamed(relayed)
                yield relayed
                if relayed.finish_reason:
                    return  # it ends the request: the decode worker has nothing to add
            landed = await h.landed()
            if landed is None:  # the hand-off failed after its first token
                call, relayed = self._continue(), None
            else:
                call = self._decode_call("Decode", messages.decode_request(h.rid, landed, h.handle))
            async for resp in self._decoded(call, relayed):
                yield resp
        finally:
            if self.finished:  # also when the caller stops reading at its last message
                await h.settled()  # the reservation goes back once no KV lands in it
            if relayed is not None and not self.decode_answered:
                # No Decode claimed the reservation (none was needed, or the caller left or
                # the call failed first, maybe before it reached the worker): give it back
                # now, not at the end of its lease, and not before the prefill worker stopped.
                await h.give_back()
            h.close()

    async def _decoded(self, call: Any, relayed: Any = None) -> AsyncIterator[Any]:
        """Relay a decode stream (less ``relayed``, the first token when the caller has it
        already); when its worker fails mid-stream, continue on another."""
        migrations = 0
        while True:
            try:
                async for resp in self._relay(call):
                    self.decode_answered = True
                    if relayed is not None:
                        resp, relayed = first_token.after(resp, relayed, self.request_id), None
                        if resp is None:
                            continue
                    self._streamed(resp)
                    yield resp
                return
            except grpc.aio.AioRpcError as exc:
                if self.finished:  # the worker died after its last message: nothing is lost
                    return
                if exc.code() not in MIGRATE_ON or self.aborted or migrations >= self.router.cfg.max_migrations:
                    raise
                migrations += 1
                relayed = None  # the next worker resumes after every token streamed so far
                call = self._migrate(exc)

    def _streamed(self, resp: Any) -> None:
        """``resp`` goes to the caller: what a migration resumes from grows by it. The
        prompt's logprobs go out once, on the first message: from the prefill worker's
        answer (``prompt_logprobs``), or as a local prefill's first message carries them; a
        worker that resumes the request after a failure computes them again, not sent."""
        if self.prompt_logprobs and not self.prompt_logprobs_sent and not resp.prompt_logprobs:
            resp.prompt_logprobs.extend(self.prompt_logprobs)
        elif self.prompt_logprobs_sent and resp.prompt_logprobs:
            del resp.prompt_logprobs[:]
        self.prompt_logprobs_sent = self.prompt_logprobs_sent or bool(resp.prompt_logprobs)
        self.streamed_tokens.extend(resp.token_ids)
        self.streamed_chars += len(resp.text)
        self.finished = self.finished or bool(resp.finish_reason)

    def _migrate(self, exc: grpc.aio.AioRpcError) -> Any:
        """Leave the failed decode worker (``leave_decode``) and resume the request."""
        self.leave_decode(exc, "mid-stream")
        self.router.stats.migrations += 1
        return self._continue()

    def _continue(self) -> Any:
        """The decode worker prefills and decodes the request by itself from the tokens
        streamed so far (a resumed ``GenerateLocal``, under a new attempt's id)."""
        self.attempt += 1
        return self._decode_call("GenerateLocal", self.reserve_msg((self.streamed_tokens, self.streamed_chars)))

    # -- calls ------------------------------------------------------------------------
    def _decode_call(self, method: str, msg: Any) -> Any:
        """``method`` on the decode worker, its messages over the token feed when open."""
        return self.router.feeds.start(self.decode_worker().address, method, msg, self.metadata, self.left())

    async def _relay(self, call: Any) -> AsyncIterator[Any]:
        """``call``'s messages, raising ``stalls.stalled`` when one is late past its worker's
        bound while another decode worker could take the request over (with none, the
        request's deadline bounds the wait)."""
        self.start_call(call)
        worker = self.decode_worker()
        try:
            async for resp in stalls.watched(call, worker.stalls, lambda: self._stall_bound(worker), worker.worker_id):
                yield resp
        finally:
            call.cancel()  # no-op when finished; aborts the decode side when we leave early

    def _stall_bound(self, worker: WorkerHandle) -> float | None:
        """How long the stream may wait for its next message; None while no other healthy
        decode worker this request has not failed on could take it over."""
        if not any(w is not worker and w.worker_id not in self.failed_decode
                   for w in self.router.workers.healthy("decode")):
            return None
        cfg = self.router.cfg
        return worker.stalls.bound(cfg.stall_floor_s, cfg.stall_ceiling_s, cfg.stall_factor)
