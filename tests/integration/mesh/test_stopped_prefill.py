"""A request given up while its KV is still being written: the reservation goes back only
once no write into it is in flight.

A reservation freed while a write into it is in flight can be reserved for another request
first, whose KV the late write then overwrites. The prefill worker here lands every KV write
3 s after posting it (the fault wrapper around real NIXL), so the window between the first
token (answered before the write) and the write's landing is wide open: the caller cancels,
``Abort``s or runs out of time in it, and the decode worker must still hold the reservation
until the prefill worker's write has landed (its ``kv_bytes_sent`` counts the write,
cancelled or not). Each gives up 1.5 s after the first token, by when the write is posted
(a stop that comes before it only ever finds nothing to wait for). So does a connection
lost between router and prefill worker, the worker alive: neither end can ask the other.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client, build_request
from pdmesh.launcher import Mesh
from pdmesh.rpc import messages
from pdmesh.rpc.clients import decode_stub, prefill_stub
from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import common_pb2, generate_pb2_grpc
from tests.integration.failover.breaking_proxy import BreakingProxy
from tests.integration.mesh_tools import extra_process, info, infos, wait_idle

WRITE_DELAY_S = 3.0
GIVE_UP_AFTER_S = 1.5
"""After the first token: the write is posted by then and lands 1.5 s later."""
STOP_WAIT_S = 5.0
"""The time a prefill worker has to stop: half the router's default lease (10 s)."""


@pytest.fixture()
def slow_prefill(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A prefill worker per test: one test's late write must not land in the next one's count."""
    args = ["prefill", "--model", mesh.spec.model, "--worker-id", "prefill-late", "--dtype", "float32",
            "--num-blocks", "256", "--block-size", "16"]
    with extra_process(tmp_path_factory.mktemp("late"), "prefill-late", args,
                       {"PDMESH_FAULT_TRANSFER_DELAY_S": str(WRITE_DELAY_S)}) as address:
        yield address


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 1000) for _ in range(150)]


def _await_release(mesh: Mesh, prefill: str, sent_before: int, timeout: float = 30.0) -> tuple[int, float]:
    """Poll until the decode worker holds no reservation; returns what the prefill worker had
    written right after (bytes since ``sent_before``: a write that lands after the release,
    seconds after it was posted, is not counted yet) and when the reservation went."""
    deadline = time.monotonic() + timeout
    while True:
        decode = infos(mesh)[mesh.decode[0].name]
        if decode.num_handoffs == 0:
            return info(prefill).kv_bytes_sent - sent_before, time.monotonic()
        assert time.monotonic() < deadline, f"the decode worker still holds {decode.num_handoffs} reservation(s)"
        time.sleep(0.02)


def _router(mesh: Mesh, prefill: str) -> list[str]:
    """A router of its own without Redis, so that it knows this prefill worker alone (not
    the mesh's, which join through Redis), and prefills every prompt there."""
    return ["router", "--model", mesh.spec.model, "--prefill", prefill, "--decode", mesh.decode[0].address,
            "--disaggregation", "strict"]


def _full_blocks_landed(mesh: Mesh, prompt: list[int], written: int) -> bool:
    block = info(mesh.decode[0].address).kv_block_bytes
    return written in (len(prompt) // 16 * block, -(-len(prompt) // 16) * block)


def _assert_landed_first(mesh: Mesh, prompt: list[int], written: int, after_s: float, since: str) -> None:
    """The reservation went back (``after_s`` after ``since``) with the prompt's KV landed."""
    assert _full_blocks_landed(mesh, prompt, written), (
        f"the reservation went back {after_s:.2f}s after {since}, with {written} bytes of its KV landed")


def test_a_stopped_prefill_ends_cancelled_once_its_write_landed(mesh: Mesh, slow_prefill: str) -> None:
    """``PrefillStream``'s third message, ``stop``: the worker ends the call CANCELLED, and not
    before the write it had in flight landed."""
    prompt, params = _prompt(3), SamplingParams(max_tokens=4, temperature=0)
    sent_before = info(slow_prefill).kv_bytes_sent

    async def run() -> tuple[grpc.StatusCode, str, float]:
        rid = "stopped-at-the-worker"
        decode = decode_stub(mesh.decode[0].address)
        handle = await decode.Reserve(messages.reserve_request(rid, prompt, params, 30_000), timeout=30)
        try:
            call = prefill_stub(slow_prefill).PrefillStream(timeout=30)
            await call.write(messages.prefill_request(rid, prompt, params, None))
            await call.write(messages.destination_message(rid, handle))
            first = await call.read()
            assert first.first_only
            await asyncio.sleep(GIVE_UP_AFTER_S)
            stopped_at = time.monotonic()
            await call.write(messages.stop_message(rid))
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while await call.read() is not grpc.aio.EOF:
                    pass
            return err.value.code(), err.value.details() or "", time.monotonic() - stopped_at
        finally:
            await decode.Release(messages.release_request(rid), timeout=30)

    code, details, took = asyncio.run(run())
    assert code == grpc.StatusCode.CANCELLED and "stopped by its router" in details, (code, details)
    # The full blocks' write was in flight (posted once the destination came); the last,
    # partial block's is posted after it, unless the stop came first.
    assert _full_blocks_landed(mesh, prompt, info(slow_prefill).kv_bytes_sent - sent_before)
    assert took > (WRITE_DELAY_S - GIVE_UP_AFTER_S) / 2, f"the call ended {took:.2f}s after the stop, before its write"
    wait_idle(mesh)


@pytest.mark.parametrize("how", ["cancel", "abort", "deadline"])
def test_a_request_given_up_after_its_first_token_frees_its_reservation_after_the_write(
    mesh: Mesh, slow_prefill: str, tmp_path: Path, how: str
) -> None:
    prompt = _prompt({"cancel": 5, "abort": 6, "deadline": 7}[how])
    sent_before = info(slow_prefill).kv_bytes_sent
    with extra_process(tmp_path, "router-late", _router(mesh, slow_prefill)) as address, \
            grpc.insecure_channel(address) as ch, Client(address) as client:
        rid = f"given-up-{how}"
        started = time.monotonic()
        # The deadline passes while the write is in flight.
        call = generate_pb2_grpc.GenerationStub(ch).Generate(
            build_request(prompt, request_id=rid, max_tokens=8, temperature=0, ignore_eos=True),
            timeout=GIVE_UP_AFTER_S + 0.5 if how == "deadline" else 60)
        first = next(call)
        assert len(first.token_ids) == 1 and not first.finish_reason
        time.sleep(max(0.0, started + GIVE_UP_AFTER_S - time.monotonic()))
        given_up = time.monotonic()
        if how == "cancel":
            call.cancel()
        elif how == "deadline":
            with pytest.raises(grpc.RpcError) as err:
                list(call)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
        else:
            assert client.abort(rid)
            rest = list(call)  # the stream ends with the abort, not an error
            assert rest and rest[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
        written, released = _await_release(mesh, slow_prefill, sent_before)
    _assert_landed_first(mesh, prompt, written, released - given_up, "the request was given up")
    wait_idle(mesh)


def test_a_call_cut_off_after_its_first_token_frees_its_reservation_after_the_write(
    mesh: Mesh, slow_prefill: str, tmp_path: Path
) -> None:
    """The connection to a live prefill worker is lost while its write is in flight: the
    worker sees its call cancelled and lets the write land, the router sees UNAVAILABLE and
    cannot tell a dead worker from one still writing, so the reservation goes back only
    after the time a worker has to stop (half a lease), not at once; the request itself
    goes on on the decode worker from its first token without waiting for that."""
    prompt = _prompt(8)
    sent_before = info(slow_prefill).kv_bytes_sent
    proxy = BreakingProxy(slow_prefill, {}, cuts={"PrefillStream": {"cut-off"}}, cut_delay_s=GIVE_UP_AFTER_S)
    try:
        with extra_process(tmp_path, "router-cut", _router(mesh, proxy.address)) as address, \
                Client(address, timeout=60) as client:
            started = time.monotonic()
            out = client.complete(prompt, request_id="cut-off", max_tokens=8, temperature=0, ignore_eos=True)
            answered = time.monotonic() - started
            assert proxy.broken == ["PrefillStream cut-off cut"]
            assert out.completion_tokens == 8
            written, released = _await_release(mesh, slow_prefill, sent_before)
    finally:
        proxy.close()
    _assert_landed_first(mesh, prompt, written, released - started, "the request began")
    assert answered < GIVE_UP_AFTER_S + STOP_WAIT_S - 0.5, f"the request waited for the give-back: {answered:.2f}s"
    wait_idle(mesh)


def test_a_worker_deaf_to_stop_keeps_the_reservation_until_its_call_ends(
    mesh: Mesh, slow_prefill: str, tmp_path: Path
) -> None:
    """A prefill worker from before ``stop`` (a rolling upgrade; the proxy drops the message)
    never reads it and ends the call when its answer is whole, after its write: the router
    that asked it to stop gives the reservation back only then."""
    prompt = _prompt(9)
    sent_before = info(slow_prefill).kv_bytes_sent
    proxy = BreakingProxy(slow_prefill, {}, drops_stop={"PrefillStream": {"deaf"}})
    try:
        with extra_process(tmp_path, "router-deaf", _router(mesh, proxy.address)) as address, \
                grpc.insecure_channel(address) as ch:
            started = time.monotonic()
            call = generate_pb2_grpc.GenerationStub(ch).Generate(
                build_request(prompt, request_id="deaf", max_tokens=8, temperature=0, ignore_eos=True), timeout=60)
            first = next(call)
            assert len(first.token_ids) == 1 and not first.finish_reason
            time.sleep(max(0.0, started + GIVE_UP_AFTER_S - time.monotonic()))
            call.cancel()
            written, released = _await_release(mesh, slow_prefill, sent_before)
            assert proxy.broken == ["PrefillStream deaf no-stop"]
    finally:
        proxy.close()
    _assert_landed_first(mesh, prompt, written, released - started, "the request began")
    wait_idle(mesh)
