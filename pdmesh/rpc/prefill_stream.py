"""``PrefillStream``, the router's hand-off call, as a protocol over a prefill: the request,
then its destination in a second message, read while the prompt computes; the first token
answered before the KV write, the whole answer after it. A third message, ``stop``, gives
the request up: computing stops, a write in flight lands, no other starts, and the call
ends CANCELLED only then, so that the router may free the reservation. Any other third
message gives it up the same way, and the call ends INVALID_ARGUMENT.

Two rules keep the call's end precise. A stop can come while the first token's write is
still in flight: the call ends only once that write is done (``pdmesh/rpc/call_writes.py``).
A request refused before its destination came is answered only once the destination came
(``_heard_out``).

This is the prefill worker's end of the call (``services/prefill/servicer.py`` serves it
with its prefill); it lives with the mesh's other wire code, the only place besides the
servicers that reads generated protobuf messages (tests/unit/architecture).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from pdmesh.errors import InvalidRequestError
from pdmesh.mesh_types import KvDestination
from pdmesh.rpc.call_writes import CallWrites, within_call
from pdmesh.rpc.convert import destination_from_proto
from pdmesh.rpc.server import read_message
from pdmesh.v1 import worker_pb2

Early = Callable[[worker_pb2.PrefillResponse], Awaitable[None]]
"""Sends the first token before the KV write."""
Prefill = Callable[
    [worker_pb2.PrefillRequest, grpc.aio.ServicerContext, asyncio.Future[KvDestination], Early],
    Awaitable[worker_pb2.PrefillResponse],
]
"""A prefill of one request into a destination that may come later (``PrefillServicer._prefill``)."""


async def serve_stream(context: grpc.aio.ServicerContext, prefill: Prefill) -> None:
    """Serve one ``PrefillStream`` call with ``prefill`` (the module's protocol)."""
    request = await read_message(context)
    if request is grpc.aio.EOF:
        raise InvalidRequestError("PrefillStream", "the stream ended before the request")
    destination: asyncio.Future[KvDestination] = asyncio.get_running_loop().create_future()
    # The first token's write may still be in flight when a stop cancels the work: the
    # call ends only once it is done (call_writes.py).
    writes = CallWrites(context)
    work = asyncio.ensure_future(prefill(request, context, destination, writes.write))
    given_up: tuple[grpc.StatusCode, str] | None = None
    """How the call ends once its work has stopped, when the router gave the request up:
    CANCELLED for a stop, INVALID_ARGUMENT for a third message that was not one."""

    async def read_rest() -> None:
        nonlocal given_up
        try:
            msg = await read_message(context)
        except Exception as exc:  # noqa: BLE001 - the prefill fails with it
            destination.set_exception(exc)
            return
        if msg is grpc.aio.EOF or not msg.HasField("destination"):
            destination.set_exception(InvalidRequestError(
                "destination", "PrefillStream's second message must carry the destination"))
            return
        destination.set_result(destination_from_proto(msg.destination))
        try:
            msg = await read_message(context)
        except Exception:  # noqa: BLE001 - the call is ending: its own cancel stops the work
            return
        if msg is grpc.aio.EOF:  # a router that never stops (older)
            return
        if msg.stop:
            given_up = (grpc.StatusCode.CANCELLED,
                        f"{request.request_id}: stopped by its router; no KV write of it is in flight")
        else:
            given_up = (grpc.StatusCode.INVALID_ARGUMENT,
                        "PrefillStream: the third message may only ask to stop (stop: true)")
        work.cancel()

    reader = asyncio.create_task(read_rest())
    try:
        answer = await work
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if given_up is None or (current is not None and current.cancelling()):
            raise  # the call itself was cancelled
        await writes.settled()
        await context.abort(*given_up)
    except Exception:
        await writes.settled()  # the status that follows must not meet a write in flight
        await _heard_out(destination, context)
        raise
    finally:
        reader.cancel()
        if not destination.done():
            destination.cancel()
        elif not destination.cancelled():
            destination.exception()  # seen (the prefill already failed with it or without)
    await writes.write(answer)


async def _heard_out(destination: asyncio.Future[KvDestination], context: grpc.aio.ServicerContext) -> None:
    """Before a failed ``PrefillStream`` ends, wait for the router's second message (or
    its end), which it sends as soon as its decode worker has reserved. A status sent
    first makes that write fail on the closed stream, and grpcio's asyncio client then
    reports the call INTERNAL, "Internal error from Core", over the status (grpc/grpc#36066):
    the router took a request it should refuse (INVALID_ARGUMENT) for a broken worker and
    tried it elsewhere (9 of 2,240 calls in seven runs of scripts/probes/mesh/refused_status_probe.py).
    Bounded by the call's deadline (``within_call``); the prompt's blocks are already freed."""
    await within_call(context, destination)
