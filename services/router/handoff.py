"""A request's hand-off from prefill to decode: the prefill worker computes the prompt into
blocks the decode worker reserved (lifecycle steps 2-3 of ``services/router/flow.py``).

The prefill starts first (``PrefillStream``'s first message), the decode worker reserves
while the prompt computes, and the reservation follows as the stream's second message:
the reservation's round trip is off the path to the first token (measured in
docs/performance.md §17). Either call failing ends the other: a decode worker that is
unreachable, full or broken mid-call is replaced and the request tried again, so is a
prefill worker that is unreachable (marked down) or broke the call (asked for its Info:
``Registry.call_failed``), and the reservation is given back whenever the prefill did not
answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc

from pdmesh.rpc import messages
from pdmesh.rpc.clients import decode_stub, prefill_stub
from services.router import failover, reservation

if TYPE_CHECKING:
    from services.router.flow import RequestFlow
    from services.router.registry import WorkerHandle

log = logging.getLogger(__name__)


class CallGroup:
    """Calls in flight side by side, cancelled as one (what ``RequestFlow.abort`` reaches)."""

    def __init__(self, calls: Sequence[Any]) -> None:
        self.calls = tuple(calls)

    def cancel(self) -> bool:
        return any([call.cancel() for call in self.calls])


async def send(call: Any, msg: Any, last: bool = False) -> None:
    """Write ``msg`` on a client-streaming ``call`` (and half-close it when ``last``). A call
    that already ended refuses the write; awaiting the call raises its status, which says
    why, so the refusal itself is not raised here."""
    try:
        await call.write(msg)
        if last:
            await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        pass


async def reserve_and_prefill(flow: RequestFlow) -> tuple[Any, Any] | None:
    """``(prefill response, decode worker's handle)``, or None to try again."""
    choice = flow.prefill
    if choice is None:
        raise RuntimeError(f"{flow.request_id}: prefill before a prefill worker was chosen")
    work = max(0, len(flow.prompt) - choice.cached_tokens)
    with choice.worker.counted(work):  # from the decision on: the next ones of a burst see it
        return await _reserve_and_prefill(flow, choice.worker, decode_stub(flow.decode_worker().address))


async def _reserve_and_prefill(flow: RequestFlow, prefill: WorkerHandle, d_stub: Any) -> tuple[Any, Any] | None:
    rid = flow.call_id
    call = prefill_stub(prefill.address).PrefillStream(metadata=flow.metadata, timeout=flow.left())
    reserve = d_stub.Reserve(flow.reserve_msg(), metadata=flow.metadata, timeout=flow.left())
    flow.start_call(CallGroup((call, reserve)))
    await send(call, messages.prefill_request(rid, flow.prompt, flow.params, None, flow.outside))
    try:
        handle = await reserve
    except grpc.aio.AioRpcError as exc:
        call.cancel()
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # full: nothing was reserved
            if not flow.worker_failed(exc):
                raise
            # The call may have broken after the worker reserved: give it back now, not
            # at its lease's end (the next attempt has its own id: ``RequestFlow.call_id``).
            await reservation.give_back(d_stub, rid)
        failover.replace_decode(flow, exc, "reserve")  # failed, or full: the next decode worker
        return None
    except BaseException:  # aborted: a reservation made meanwhile goes back now, not at its lease's end
        call.cancel()
        await reservation.give_back(d_stub, rid)
        raise
    renewing = asyncio.create_task(reservation.keep_alive(d_stub, rid, flow.core.cfg.lease_ms))
    try:
        await send(call, messages.destination_message(rid, handle), last=True)
        response = await call
    except grpc.aio.AioRpcError as exc:
        await reservation.give_back(d_stub, rid)
        if exc.code() == grpc.StatusCode.ABORTED:  # the KV write to the decode worker failed
            failover.replace_decode(flow, exc, "kv transfer")
            return None
        if not flow.worker_failed(exc):
            raise
        flow.core.workers.call_failed(prefill, exc.code())
        flow.tried.add(prefill.worker_id)
        flow.core.prefill_retries += 1
        log.warning("prefill worker %s failed %s (%s): %s", prefill.worker_id, rid, exc.code().name, exc.details())
        return None
    except BaseException:
        await reservation.give_back(d_stub, rid)
        raise
    finally:
        renewing.cancel()
    return response, handle
