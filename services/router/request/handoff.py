"""A request's hand-off from prefill to decode: the prefill worker computes the prompt into
blocks the decode worker reserved (lifecycle steps 2-3 of ``services/router/request/flow.py``).

The prefill starts first (``PrefillStream``'s first message), the decode worker reserves
while the prompt computes, and the reservation follows as the stream's second message:
the reservation's round trip is off the path to the first token (measured in
docs/performance/log.md §17). The prefill worker answers the first token before it writes the
KV, and the whole answer after (``Handoff.landed``): the write is off that path too (§38).
Either call failing ends the other: a decode worker that is
unreachable, full or broken mid-call is replaced and the request tried again, so is a
prefill worker that is unreachable (marked down) or broke the call (asked for its Info:
``Registry.call_failed``), and the reservation is given back whenever the request will
not decode from it: once the prefill call ended, never while a write into it may still be
in flight (``prefill_call.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from pdmesh.errors import UnavailableError
from pdmesh.rpc import messages
from pdmesh.rpc.clients import decode_stub, prefill_stub
from services.router.request import reservation
from services.router.request.prefill_call import PrefillCall

if TYPE_CHECKING:
    from services.router.request.state import RequestState
    from services.router.worker_handle import WorkerHandle

log = logging.getLogger(__name__)


class CallGroup:
    """Calls in flight side by side, cancelled as one (what ``RequestState.abort`` reaches)."""

    def __init__(self, calls: Sequence[Any]) -> None:
        self.calls = tuple(calls)

    def cancel(self) -> bool:
        return any([call.cancel() for call in self.calls])


def stop_wait_s(flow: RequestState) -> float:
    """How long a prefill worker may take to stop: half a lease, which the reservation has
    left at least (renewed every third), so it never lapses while a write may land."""
    return flow.router.cfg.lease_ms / 2000


DECODE_WATCH_S = 0.25
"""How often a hand-off waiting for its KV write looks whether its decode worker is down."""


class DecodeLostError(Exception):
    """The decode worker of a hand-off was marked down while its KV was being written."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(f"decode worker {worker_id} stopped answering while its KV was written")

    def status(self) -> grpc.aio.AioRpcError:
        """As the call that failed reports it: ABORTED, a lost KV write (``MIGRATE_ON``)."""
        return grpc.aio.AioRpcError(grpc.StatusCode.ABORTED, grpc.aio.Metadata(), grpc.aio.Metadata(), str(self))


def _retrieved(read: asyncio.Future[Any]) -> None:
    """A read nobody waits for any more: its end is retrieved, not reported."""
    if not read.cancelled():
        read.exception()


async def give_back_when_stopped(flow: RequestState, call: PrefillCall, decode_rpc: Any, rid: str,
                                 prefill_response: Any = None) -> None:
    """Give the reservation back once ``call`` can write into it no more; a worker that did
    not stop in time (``stop_wait_s``) leaves it to its lease (shielded: the caller may have
    been cancelled). A call cut off (``PrefillCall.cut_off``) gets the time a worker has to
    stop before its reservation goes, without holding up the caller (a retry on another
    worker). Either is counted (``RouterStats.late_give_backs``): blocks held for nothing."""
    wait_s, late = stop_wait_s(flow), flow.router.stats.late_give_backs

    async def run() -> None:
        if not await call.stopped(wait_s):
            late["not_stopped"] += 1
            log.warning("the prefill worker did not stop %s within %.1fs: its reservation is left to its lease",
                        rid, wait_s)
        elif await call.cut_off():
            late["cut_off"] += 1
            log.info("the prefill call of %s was cut off after its destination: its reservation goes back in %.1fs",
                     rid, wait_s)
            reservation.give_back_later(decode_rpc, rid, wait_s)
        else:
            await reservation.give_back(decode_rpc, rid, prefill_response)

    await asyncio.shield(run())


async def reserve_and_prefill(flow: RequestState) -> Handoff | None:
    """The hand-off once the first token came, or None to try again."""
    choice = flow.prefill
    if choice is None:
        raise RuntimeError(f"{flow.request_id}: prefill before a prefill worker was chosen")
    work = max(0, len(flow.prompt) - choice.cached_tokens)
    with choice.worker.counted(work):  # from the decision until its prompt is computed
        return await _reserve_and_prefill(flow, choice.worker, decode_stub(flow.decode_worker().address))


@dataclass(eq=False)
class Handoff:
    """A prefill whose first token came while its KV may still be on its way to the
    reservation (``PrefillStream`` answers the token first): ``landed`` waits for the rest."""

    flow: RequestState
    prefill: WorkerHandle
    decode_rpc: Any
    rid: str
    call: PrefillCall
    handle: Any
    """The decode worker's reservation (a ``KvHandle``)."""
    renewing: asyncio.Task[None]
    """Keeps the reservation's lease until the KV landed or the hand-off failed."""
    first: Any = None
    """The first token (a ``PrefillResponse``; the whole answer from a worker that answers once)."""
    response: Any = None
    """The whole answer, once the KV landed."""
    ended: bool = False
    """``landed`` has run: what it found stands (a failure is dealt with once)."""
    returned: bool = False
    """The reservation was given back (or left to its lease): once is enough."""

    async def landed(self) -> Any | None:
        """The whole answer once every KV write is complete in the decode worker's memory,
        or None when the hand-off failed after the first token (``_answer``)."""
        if not self.ended:
            self.ended = True
            self.response = await self._answer()
            self.renewing.cancel()
        return self.response

    async def _answer(self) -> Any | None:
        """The prefill call's next answer, or None when it failed at a worker: the
        reservation goes back and the failed worker is dealt with (``_failed``); any other
        failure is raised, the reservation given back once the worker stopped. An answer
        that crossed an abort on its way counts as the abort."""
        try:
            async with asyncio.timeout_at(self.flow.deadline):  # the call's own runs out later: see below
                msg = await self._read_while_decode_lives()  # raises the call's status when it failed
        except DecodeLostError as exc:
            self._decode_lost(exc)
            return None
        except grpc.aio.AioRpcError as exc:
            await self._failed(exc)
            return None
        except TimeoutError:
            await self.give_back()
            raise TimeoutError(f"{self.flow.request_id}: its deadline passed during its prefill") from None
        except BaseException:
            await self.give_back()
            raise
        if msg is grpc.aio.EOF:  # ended OK with nothing more to say: a broken worker
            await self.give_back()
            raise UnavailableError(f"the prefill worker ended {self.rid}'s call without its answer")
        if self.flow.aborted:
            await self.give_back()
            raise asyncio.CancelledError
        return msg

    async def _read_while_decode_lives(self) -> Any:
        """The prefill call's next message, unless the decode worker it writes into is marked
        down first (a stopped worker's pool takes no write: the prefill would wait for the
        write's deadline, and the request with it)."""
        decode = self.flow.decode_worker()
        # Waited on, never cancelled: a read cancelled as its message came would lose it.
        reading = asyncio.ensure_future(self.call.read())
        try:
            while True:
                done, _ = await asyncio.wait({reading}, timeout=DECODE_WATCH_S)
                if done:
                    return reading.result()
                if not decode.healthy:
                    raise DecodeLostError(decode.worker_id)
        finally:
            if not reading.done():  # left for the call's end (its stop reads on: prefill_call.py)
                reading.add_done_callback(_retrieved)

    def _decode_lost(self, exc: DecodeLostError) -> None:
        """The decode worker was marked down while its KV was written: the request goes on
        elsewhere at once (``RequestState.leave_decode``: from the first token on, the next
        worker prefills it by itself), and the reservation goes back in the background once
        the prefill worker stopped (or is left to its lease on the worker that stopped)."""
        self.renewing.cancel()
        if not self.returned:
            self.returned = True
            reservation.in_background(give_back_when_stopped(self.flow, self.call, self.decode_rpc, self.rid))
        self.flow.leave_decode(exc.status(), "kv transfer")

    async def _failed(self, exc: grpc.aio.AioRpcError) -> None:
        """The prefill call failed once the reservation was made: the reservation goes back
        and the failed worker is left for another, or ``exc`` is raised when it was not a
        worker's failure (the caller left, the deadline passed); an abort is raised as the
        cancel it is (the worker's CANCELLED answers the router's stop)."""
        flow, prefill = self.flow, self.prefill
        await self.give_back()
        if flow.aborted:
            raise asyncio.CancelledError
        if exc.code() == grpc.StatusCode.ABORTED:  # the KV write to the decode worker failed
            flow.leave_decode(exc, "kv transfer")
            return
        if not flow.worker_failed(exc):
            raise exc
        flow.router.workers.call_failed(prefill, exc)
        flow.tried.add(prefill.worker_id)
        flow.router.stats.prefill_retries += 1
        log.warning("prefill worker %s failed %s (%s): %s", prefill.worker_id, self.rid, exc.code().name,
                    exc.details())

    async def settled(self) -> None:
        """``landed`` for a request the caller already has whole: a failure now is the
        hand-off's alone (dealt with as in ``landed``), not the caller's."""
        with contextlib.suppress(grpc.aio.AioRpcError, UnavailableError):
            await self.landed()

    async def give_back(self) -> None:
        """Give the reservation back, once, after the prefill worker stopped writing into it
        (``give_back_when_stopped``)."""
        self.renewing.cancel()
        if not self.returned:
            self.returned = True
            await give_back_when_stopped(self.flow, self.call, self.decode_rpc, self.rid, self.response)

    def close(self) -> None:
        """Stop renewing and end the call: for after ``landed`` or ``give_back`` (whose stop,
        when it was cut short by a cancel, goes on: ``PrefillCall.close``)."""
        self.renewing.cancel()
        self.call.close()


async def _reserve_and_prefill(flow: RequestState, prefill: WorkerHandle, decode_rpc: Any) -> Handoff | None:
    rid = flow.call_id
    # The request's deadline is kept here (``Handoff._answer``), the call's gRPC deadline only
    # after the time a worker has to stop: that deadline would end the call at the
    # router at once, while the worker may still be writing into the reservation.
    call = PrefillCall(prefill_stub(prefill.address).PrefillStream(
        metadata=flow.metadata, timeout=flow.left() + stop_wait_s(flow)), rid)
    reserve = decode_rpc.Reserve(flow.reserve_msg(), metadata=flow.metadata, timeout=flow.left())
    flow.start_call(CallGroup((call, reserve)))
    await call.request(messages.prefill_request(rid, flow.prompt, flow.params, None, flow.outside))
    try:
        handle = await reserve
        await call.destination(handle)  # refused: the read says why
    except grpc.aio.AioRpcError as exc:  # Reserve's failure
        call.abandon()  # no destination went: nothing is written
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # full: nothing was reserved
            if not flow.worker_failed(exc):
                raise
            # The call may have broken after the worker reserved: give it back now, not
            # at its lease's end (the next attempt has its own id: ``RequestState.call_id``).
            await reservation.give_back(decode_rpc, rid)
        flow.leave_decode(exc, "reserve")  # failed, or full: the next decode worker
        return None
    except BaseException:  # aborted: a reservation made meanwhile goes back now, not at its lease's end
        await give_back_when_stopped(flow, call, decode_rpc, rid)
        raise
    renewing = asyncio.create_task(reservation.keep_alive(decode_rpc, rid, flow.router.cfg.lease_ms))
    handoff = Handoff(flow, prefill, decode_rpc, rid, call, handle, renewing)
    handoff.first = await handoff._answer()
    if handoff.first is None:
        return None
    if not handoff.first.first_only:  # a prefill worker from before the split answers once (rolling upgrades)
        handoff.response, handoff.ended = handoff.first, True
        renewing.cancel()
    return handoff
