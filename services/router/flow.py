"""One request's way through the mesh, as one object that owns its downstream calls.

Lifecycle (the methods below, in this order):
  1. route    — decode worker by load; prefill worker by policy over the Redis index
                (consistent hashing when Redis is down); ``RouterCore.local_reason`` says
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

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from pdmesh.errors import UnavailableError
from pdmesh.kv.block_hash import BlockHash
from pdmesh.rpc import messages
from pdmesh.rpc.status import WORKER_FAILED
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry import tracing
from services.router import failover, first_token, handoff, stalls
from services.router.caller_stream import caller_stream
from services.router.policies import Decision
from services.router.registry import WorkerHandle

if TYPE_CHECKING:
    from services.router.core import RouterCore

PREFILL_ATTEMPTS = 3
"""Routing attempts before the stream starts: a prefill worker that is unreachable or
breaks the call, or a decode worker that does either, is full or loses the KV write, sends
the request to another (the only decode worker: to it again)."""
MIGRATE_ON = WORKER_FAILED | {grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND}
"""Decode stream failures that move the request to another decode worker (the worker
died, drained, lost its KV, or no longer holds the reservation: its lease ran out while
the worker was stopped); the caller's own cancel never reaches here as one of them."""


@dataclass(eq=False)
class RequestFlow:
    core: RouterCore
    request_id: str
    prompt: list[int]
    params: SamplingParams
    """Parsed and validated once, here; workers receive them re-encoded."""
    deadline: float
    """Event-loop time by which the whole request must be done."""
    trace: Any = None
    """The caller's trace context."""
    decode: WorkerHandle | None = None
    prefill: Decision | None = None
    tried: set[str] = field(default_factory=set)
    """Prefill workers that failed this request."""
    call: Any = None
    """The downstream gRPC call in progress (what ``abort`` cancels)."""
    aborted: bool = False
    metadata: Any = None
    streamed_tokens: list[int] = field(default_factory=list)
    """Tokens relayed to the caller so far (what a migration resumes from)."""
    streamed_chars: int = 0
    finished: bool = False
    """A message with a finish reason was relayed: the request is complete."""
    failed_decode: set[str] = field(default_factory=set)
    """Decode workers that failed this request (tried again only when no other is left)."""
    hashes: list[BlockHash] = field(default_factory=list)
    """The prompt's block hashes, computed once in ``run`` for both routing decisions."""
    decode_held: int = 0
    """Prompt tokens the router had sent its decode worker before this request."""
    decode_answered: bool = False
    """A decode worker's stream has sent a message (its reservation is claimed)."""
    prompt_logprobs: list[Any] = field(default_factory=list)
    """The prefill worker's prompt logprobs, for the caller's first message."""
    prompt_logprobs_sent: bool = False
    attempt: int = 0
    """Which attempt at the workers this is: 0 first; a retry before the stream or a
    migration starts the next."""
    outside: dict[str, int] | None = None
    """What the index lookup of the current attempt listed outside the candidates (the
    kvstore tier): sent to the prefill worker (``IndexSeen.outside``)."""

    @property
    def call_id(self) -> str:
        """The request's id at the workers for the current attempt. A worker frees a call
        the router cancelled when it notices the cancel, which a retry sent to the same
        worker can beat: under one id the retry was refused as "already in flight"
        (INVALID_ARGUMENT for the mesh's own retry). The caller only ever sees
        ``request_id``."""
        return self.request_id if not self.attempt else f"{self.request_id}~{self.attempt}"

    @property
    def kv_tokens(self) -> int:
        """The tokens its decode worker's pool must hold: the prompt and every token asked for."""
        return len(self.prompt) + self.params.max_tokens

    def decode_worker(self) -> WorkerHandle:
        if self.decode is None:
            raise RuntimeError(f"{self.request_id}: a stage ran before run() chose the decode worker")
        return self.decode

    def left(self) -> float:
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    # -- the stream the caller sees ---------------------------------------------------
    def stream(self) -> AsyncIterator[Any]:
        """``run`` as the caller sees it, with telemetry and the abort contract (caller_stream.py)."""
        return caller_stream(self)

    def abort(self) -> bool:
        """Cancel the current downstream call; False when already aborting."""
        if self.aborted:
            return False
        self.aborted = True
        if self.call is not None:
            self.call.cancel()
        return True

    # -- the lifecycle ----------------------------------------------------------------
    async def run(self) -> AsyncIterator[Any]:
        self.hashes = self.core.prompt_hashes(self.prompt, self.params)
        self.decode, self.decode_held = self.core.route_decode(self.hashes, tokens=self.kv_tokens)
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
        core, decode = self.core, self.decode_worker()
        span = tracing.start_span("router.route", self.trace, decode=decode.worker_id,
                                  candidates=len(core.workers.healthy("prefill")))
        choice, seen = await core.route_prefill(self.prompt, self.hashes, self.tried, tracing.child_context(span))
        self.outside = seen.outside
        reason = core.local_reason(choice, self.prompt, self.decode_held, decode)
        span.set_attributes({
            "pdmesh.policy": core.prefill_router.policy.name,
            "pdmesh.prefill": choice.worker.worker_id if choice else "",
            "pdmesh.reason": choice.reason if choice else "",
            "pdmesh.cached_prefix_tokens": choice.cached_tokens if choice else 0,
            "pdmesh.fallback": reason,
        })
        span.end()
        self.prefill = choice
        core.settle_route(choice, reason, self.hashes)
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
        first token; None to try again (``services/router/handoff.py``)."""
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
                if exc.code() not in MIGRATE_ON or self.aborted or migrations >= self.core.cfg.max_migrations:
                    raise
                migrations += 1
                relayed = None  # the next worker resumes after every token streamed so far
                call = self._migrate(exc)

    def worker_failed(self, exc: grpc.aio.AioRpcError) -> bool:
        """``exc`` is the worker's failure, not the request's or its caller's (the chaos
        test saw 3 of 6,292 requests fail before a broken prefill or ``Reserve`` call was
        tried again)."""
        return exc.code() in WORKER_FAILED and not self.aborted

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
        """Leave the failed decode worker (``failover.replace_decode``) and resume the request."""
        failover.replace_decode(self, exc, "mid-stream")
        self.core.migrations += 1
        return self._continue()

    def _continue(self) -> Any:
        """The decode worker prefills and decodes the request by itself from the tokens
        streamed so far (a resumed ``GenerateLocal``, under a new attempt's id)."""
        self.attempt += 1
        return self._decode_call("GenerateLocal", self.reserve_msg((self.streamed_tokens, self.streamed_chars)))

    # -- calls ------------------------------------------------------------------------
    def _decode_call(self, method: str, msg: Any) -> Any:
        """``method`` on the decode worker, its messages over the token feed when open."""
        return self.core.feeds.start(self.decode_worker().address, method, msg, self.metadata, self.left())

    def reserve_msg(self, resume: tuple[list[int], int] | None = None) -> Any:
        return messages.reserve_request(self.call_id, self.prompt, self.params, self.core.cfg.lease_ms, resume)

    def start_call(self, call: Any) -> Any:
        """Make ``call`` the one ``abort`` cancels; refuse to start it once aborted."""
        if self.aborted:
            call.cancel()
            raise asyncio.CancelledError
        self.call = call
        return call

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
                   for w in self.core.workers.healthy("decode")):
            return None
        cfg = self.core.cfg
        return worker.stalls.bound(cfg.stall_floor_s, cfg.stall_ceiling_s, cfg.stall_factor)
