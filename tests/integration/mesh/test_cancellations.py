"""Callers that leave or abort through the whole mesh: every worker frees the request's
blocks, and no reservation is held past its request (given back late, or left to its lease)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import grpc

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from pdmesh.telemetry.scrape import scrape, total
from services.router.request.stats import LATE_WHY
from tests.integration.mesh_tools import wait_idle
from tests.oracle import mixed_prompts


def _late(mesh: Mesh) -> dict[str, float]:
    """Reservations the router gave back late, by why, and those the decode workers' lease
    reaper freed."""
    assert mesh.router is not None
    router = scrape(mesh.router.metrics_address)
    late = {why: total(router, "pdmesh_reservations_given_back_late_total", why=why)
            for why in LATE_WHY}
    late["expired"] = sum(total(scrape(d.metrics_address), "pdmesh_expired_leases_total") for d in mesh.decode)
    return late


def test_random_cancellations_leave_no_block_anywhere(mesh: Mesh, client: Client) -> None:
    rng = random.Random(41)
    late_before = _late(mesh)
    prompts = mixed_prompts(100, seed=42)
    completed = []

    def one(i: int) -> None:
        stream = client.stream(prompts[i], timeout=60, request_id=f"cancel-{i}", max_tokens=40, temperature=0.5,
                               ignore_eos=True)
        stop_after = rng.randrange(0, 6) if i % 3 else 10**6
        try:
            for n, _ in enumerate(stream):
                if n >= stop_after:
                    stream.cancel()
                    return
            completed.append(i)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(one, range(100)))
    assert len(completed) >= 30
    # Sooner than the 10 s lease: the cancellations freed every block, not the lease reaper
    # (a caller leaving right after a first token streamed from the prefill's answer, before
    # the Decode call claims the reservation, gives it back too).
    state = wait_idle(mesh, timeout=8)
    for name, info in state.items():
        assert info.used_blocks == 0 and info.num_handoffs == 0, name
        assert info.free_blocks == info.num_blocks, name
    # Nothing here breaks a connection or stalls a worker: every reservation went back as
    # soon as its request gave it up (a stop that crossed the first token's write, or the
    # whole answer, held one back 5-10 s before).
    assert _late(mesh) == late_before


def test_abort_ends_the_stream_with_abort_and_frees_blocks(mesh: Mesh, client: Client) -> None:
    stream = client.generate([5, 6, 7, 8] * 10, request_id="to-abort", max_tokens=400, ignore_eos=True,
                             temperature=0)
    got = 0
    last = None
    aborted = False
    for resp in stream:
        got += len(resp.token_ids)
        last = resp
        if got >= 3 and not aborted:
            with Client(mesh.router_address) as other:
                assert other.abort("to-abort")
            aborted = True
    assert last is not None and last.finish_reason == 3  # FINISH_REASON_ABORT
    assert 3 <= last.usage.completion_tokens < 400
    assert not client.abort("to-abort")  # no longer in flight
    wait_idle(mesh)
