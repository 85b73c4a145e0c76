"""``PrefillStream`` (the router's hand-off: the prompt computes while the decode worker
reserves, the destination follows): a stream whose second message does not carry the
destination, or that ends after the request, is refused with INVALID_ARGUMENT naming
what was missing, and so is one whose third message is not a stop; the prefill worker
keeps no block of either."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from pdmesh.launcher import Mesh
from pdmesh.rpc import messages
from pdmesh.rpc.clients import decode_stub, prefill_stub
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry.scrape import scrape, total
from pdmesh.v1 import worker_pb2, worker_pb2_grpc
from services.router.request.prefill_call import PrefillCall
from tests.integration.mesh_tools import wait_idle


@pytest.mark.parametrize("second", ["empty", "none"])
def test_a_stream_without_its_destination_is_refused(mesh: Mesh, second: str) -> None:
    rng = random.Random(7)
    prompt = [rng.randrange(5, 1000) for _ in range(100)]

    async def run() -> grpc.aio.AioRpcError:
        call = prefill_stub(mesh.prefill[0].address).PrefillStream(timeout=30)
        await call.write(messages.prefill_request(f"no-dest-{second}", prompt, SamplingParams(max_tokens=4), None))
        if second == "empty":
            await call.write(worker_pb2.PrefillRequest(request_id=f"no-dest-{second}"))
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for msg in call:  # the first token may come first: it does not wait for the destination
                assert msg.first_only
        return err.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "destination" in (err.details() or "")
    wait_idle(mesh)


def test_a_request_it_refuses_waits_for_its_destination_so_the_status_stays_precise(mesh: Mesh) -> None:
    """A request the prefill worker refuses at once (here a token outside the vocabulary)
    is answered once the router's destination came, not before: a status sent first made
    that write fail, and grpcio's asyncio client then reported INTERNAL over it
    (grpc/grpc#36066; 9 of 2,240 calls in scripts/probes/mesh/refused_status_probe.py), which the router takes for a broken
    worker. On the earlier servicer the destination's write was refused here every time."""

    async def run() -> tuple[bool, grpc.aio.AioRpcError]:
        call = prefill_stub(mesh.prefill[0].address).PrefillStream(timeout=30)
        await call.write(messages.prefill_request("refused", [5, 9000, 7], SamplingParams(max_tokens=2), None))
        await asyncio.sleep(0.5)  # far longer than the refusal takes
        answered_early = call.done()  # the destination's write would be refused
        if not answered_early:
            await call.write(messages.destination_message("refused", worker_pb2.KvHandle(worker_id="decode-0")))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        return answered_early, err.value

    answered_early, err = asyncio.run(run())
    assert not answered_early, f"answered before its destination came: {err.code()} {err.details()}"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "9000" in (err.details() or "")
    wait_idle(mesh)


@contextlib.asynccontextmanager
async def _into_reservation(mesh: Mesh, rid: str, prompt: list[int], params: SamplingParams
                            ) -> AsyncIterator[tuple[Any, worker_pb2.KvHandle]]:
    """A ``PrefillStream`` call sent its request and, as its destination, a reservation
    made for it on the decode worker, which is released when the block ends."""
    decode = decode_stub(mesh.decode[0].address)
    handle = await decode.Reserve(messages.reserve_request(rid, prompt, params, 10_000), timeout=30)
    try:
        call = prefill_stub(mesh.prefill[0].address).PrefillStream(timeout=30)
        await call.write(messages.prefill_request(rid, prompt, params, None))
        await call.write(messages.destination_message(rid, handle))
        yield call, handle
    finally:
        await decode.Release(messages.release_request(rid), timeout=30)


def test_a_third_message_other_than_stop_is_refused(mesh: Mesh) -> None:
    """Only ``stop`` may follow the destination: anything else gives the request up as a
    stop would (no write left in flight) and ends the call INVALID_ARGUMENT."""
    rng = random.Random(13)
    prompt = [rng.randrange(5, 1000) for _ in range(400)]
    params = SamplingParams(max_tokens=4, temperature=0)

    async def run() -> grpc.aio.AioRpcError:
        async with _into_reservation(mesh, "third-not-stop", prompt, params) as (call, handle):
            await call.write(messages.destination_message("third-not-stop", handle))  # a second destination
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for msg in call:
                    assert msg.first_only
            return err.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "stop" in (err.details() or "")
    wait_idle(mesh)


def test_the_first_token_is_answered_before_the_kv_write(mesh: Mesh) -> None:
    """``PrefillStream`` answers twice: the first token alone (``first_only``), then the
    whole answer once the KV is in the reservation: the same token, with the write's
    figures. Given back, the reservation leaves no block on either worker."""
    rng = random.Random(11)
    prompt = [rng.randrange(5, 1000) for _ in range(150)]
    params = SamplingParams(max_tokens=4, temperature=0)

    async def run() -> list[worker_pb2.PrefillResponse]:
        async with _into_reservation(mesh, "two-answers", prompt, params) as (call, _):
            await call.done_writing()
            answers = [msg async for msg in call]
            assert (await call.code()) == grpc.StatusCode.OK
            return answers

    first, whole = asyncio.run(run())
    assert first.first_only and not whole.first_only
    assert first.first_token_id == whole.first_token_id and first.first_text == whole.first_text
    assert first.blocks_transferred == 0 and not first.HasField("kv_written_inline")
    assert whole.blocks_transferred == -(-len(prompt) // 16) and whole.bytes_transferred > 0
    wait_idle(mesh)


def test_a_stop_while_the_first_token_is_still_being_sent_ends_the_call_cancelled(mesh: Mesh) -> None:
    """A stop can come while the first token's write on the call is still in flight (the
    router relayed it, and its caller left, before the worker's write completed). gRPC keeps
    such a write going when the task awaiting it is cancelled, and ending the call then
    fails (``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``): the call hung, the router waited its 5 s
    for the worker to stop and left the reservation to its lease. The test holds the write
    in flight the way a slow reader does: its channel's stream window is one byte, and it
    reads nothing until the stop was sent. The call must end CANCELLED once the token was
    read, well within the time the router gives a worker to stop."""
    rng = random.Random(17)
    prompt = [rng.randrange(5, 1000) for _ in range(40)]
    params = SamplingParams(max_tokens=4, temperature=0)
    rid = "stop-mid-first-token"

    async def run() -> tuple[list[worker_pb2.PrefillResponse], grpc.StatusCode]:
        decode = decode_stub(mesh.decode[0].address)
        handle = await decode.Reserve(messages.reserve_request(rid, prompt, params, 10_000), timeout=30)
        options = [("grpc.http2.lookahead_bytes", 1), ("grpc.http2.bdp_probe", 0)]
        worker = mesh.prefill[0]
        first_tokens = _first_tokens(worker.metrics_address)
        async with grpc.aio.insecure_channel(worker.address, options=options) as channel:
            try:
                call = worker_pb2_grpc.PrefillStub(channel).PrefillStream(timeout=30)
                await call.write(messages.prefill_request(rid, prompt, params, None))
                await call.write(messages.destination_message(rid, handle))
                # The worker times its first token right before it writes it (nothing is
                # awaited between): from then on the write is in flight, stalled.
                async with asyncio.timeout(20):
                    while _first_tokens(worker.metrics_address) == first_tokens:
                        await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)
                await call.write(messages.stop_message(rid))
                await call.done_writing()
                await asyncio.sleep(0.5)  # the worker takes the stop while its write stalls
                async with asyncio.timeout(3):
                    answers = []
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        async for msg in call:
                            answers.append(msg)
                    return answers, await call.code()
            finally:
                await decode.Release(messages.release_request(rid), timeout=30)

    answers, code = asyncio.run(run())
    assert code == grpc.StatusCode.CANCELLED, code
    assert [a.first_only for a in answers] == [True]
    wait_idle(mesh, timeout=8)


def _first_tokens(metrics_address: str) -> float:
    """First tokens the worker has timed (its time-to-first-token histogram's count)."""
    return total(scrape(metrics_address), "pdmesh_time_to_first_token_seconds_count")


def test_a_call_whose_whole_answer_came_is_not_stopped_nor_taken_as_cut_off(mesh: Mesh) -> None:
    """The router gives a reservation back once the prefill call cannot write into it
    any more (``PrefillCall.stopped``), and 5 s later when the call was cut off. Once the
    whole answer came every write is done: no stop is sent (it would cross the call's end,
    and grpcio reports a write refused there as INTERNAL over the worker's OK, grpc/grpc#36066),
    and the call is not taken as cut off whatever its status."""
    rng = random.Random(19)
    prompt = [rng.randrange(5, 1000) for _ in range(60)]
    params = SamplingParams(max_tokens=4, temperature=0)
    rid = "answered-then-given-back"

    async def run() -> tuple[bool, bool, grpc.StatusCode, bool]:
        decode = decode_stub(mesh.decode[0].address)
        handle = await decode.Reserve(messages.reserve_request(rid, prompt, params, 10_000), timeout=30)
        try:
            raw = prefill_stub(mesh.prefill[0].address).PrefillStream(timeout=30)
            call = PrefillCall(raw, rid)  # the router's end of the call, as handoff.py drives it
            await call.request(messages.prefill_request(rid, prompt, params, None))
            await call.destination(handle)
            first, whole = await call.read(), await call.read()
            assert first.first_only and not whole.first_only
            stopped = await call.stopped(5.0)  # right after the answer, as the router does
            code = await asyncio.wait_for(raw.code(), 5)
            return stopped, await call.cut_off(), code, not call.stop_sent
        finally:
            await decode.Release(messages.release_request(rid), timeout=30)

    stopped, cut_off, code, no_stop = asyncio.run(run())
    assert stopped and not cut_off and no_stop, (stopped, cut_off, code)
    assert code == grpc.StatusCode.OK
    wait_idle(mesh)
