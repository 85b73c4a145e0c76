"""Failures that need their own mesh: refused workers, a prefill worker dying mid-transfer."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.telemetry.scrape import scrape, total
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import WORKER_ARGS, admin, info, wait_idle
from tests.oracle import mixed_prompts


def test_incompatible_workers_are_refused_with_a_reason(llama_dir: Path, tmp_path: Path) -> None:
    spec = MeshSpec(
        model=str(llama_dir), prefill=2, decode=1, worker_args=WORKER_ARGS,
        prefill_args=[], router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path),
    )
    mesh = Mesh(spec)
    # prefill-1 uses another block size; a third worker another hash seed.
    spec.prefill_args = []
    mesh.start_redis()
    try:
        good = mesh.spawn_worker("prefill", 0)
        odd = mesh.spawn("prefill-odd", ["prefill", "--model", str(llama_dir), "--worker-id", "odd",
                                          *mesh.port_args("prefill-odd"), "--dtype", "float32",
                                          "--num-blocks", "64", "--block-size", "8"])
        seeded = mesh.spawn("prefill-seed", ["prefill", "--model", str(llama_dir), "--worker-id", "seed",
                                              *mesh.port_args("prefill-seed"), *WORKER_ARGS,
                                              "--hash-seed", "7"])
        dec = mesh.spawn_worker("decode", 0)
        mesh.await_ready(good, odd, seeded, dec)
        mesh.prefill += [odd, seeded]
        mesh.restart_router(args=[])
        workers = {w.info.worker_id: w for w in admin(mesh).ListWorkers(admin_pb2.ListWorkersRequest()).workers}
        assert workers["prefill-0"].healthy and not workers["prefill-0"].refused_reason
        assert not workers["odd"].healthy
        assert workers["odd"].refused_reason == "block_size 8 differs from the mesh's 16"
        assert workers["seed"].refused_reason == "hash_seed 7 differs from the mesh's 0"
        with Client(mesh.router_address) as c:
            for p in mixed_prompts(4, seed=3):
                assert len(c.complete(p, max_tokens=3, temperature=0).token_ids) == 3
        assert "refusing prefill worker odd" in mesh.router.log.read_text()  # type: ignore[union-attr]
    finally:
        mesh.stop()


def test_prefill_killed_mid_transfer_is_retried_and_leaks_nothing(
    llama_dir: Path, tmp_path: Path, hf_refs
) -> None:  # type: ignore[no-untyped-def]
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, worker_args=WORKER_ARGS,
                    router_args=["--info-interval-s", "0.2", "--prefill-policy", "round_robin"],
                    log_dir=str(tmp_path))
    mesh = Mesh(spec)
    os.environ["PDMESH_FAULT_TRANSFER_DELAY_S"] = "3"
    try:
        mesh.start()  # prefill-0 starts its writes 3 s late: long enough to kill it mid-transfer
    finally:
        del os.environ["PDMESH_FAULT_TRANSFER_DELAY_S"]
    try:
        healthy = mesh.spawn_worker("prefill", 1)
        mesh.await_ready(healthy)
        # Restart the router so it knows both prefill workers.
        mesh.restart_router(args=["--prefill-policy", "least_loaded", "--info-interval-s", "0.2"])
        prompt = mixed_prompts(8, seed=61)[7]
        result: dict = {}

        def call() -> None:
            with Client(mesh.router_address) as c:
                t = time.monotonic()
                result["out"] = c.complete(prompt, max_tokens=8, temperature=0, timeout=60)
                result["seconds"] = time.monotonic() - t

        # The slow worker is chosen first (both idle, least_loaded takes the lowest load,
        # ties by id); kill it while its write is pending.
        thread = threading.Thread(target=call)
        thread.start()
        slow = mesh.prefill[0]
        deadline = time.monotonic() + 30
        while not total(scrape(slow.metrics_address), "pdmesh_time_to_first_token_seconds_count"):
            assert time.monotonic() < deadline, "the slow worker never computed the prompt"
            time.sleep(0.02)
        assert not info(slow.address).kv_bytes_sent
        mesh.kill(slow)  # its prompt computed, its write not yet sent
        thread.join(60)
        assert not thread.is_alive(), "the request hung after its prefill worker died"
        want = hf_refs["llama"].greedy(prompt, 8)
        assert result["out"].token_ids == want
        stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
        assert stats.prefill_retries == 1
        # The decode worker freed the first reservation: nothing is held anywhere alive.
        mesh.prefill = mesh.prefill[1:]
        wait_idle(mesh)
    finally:
        mesh.stop()


def test_strict_disaggregation_without_prefill_is_unavailable(llama_dir: Path, tmp_path: Path) -> None:
    spec = MeshSpec(model=str(llama_dir), prefill=0, decode=1, worker_args=WORKER_ARGS,
                    router_args=["--disaggregation", "strict"], log_dir=str(tmp_path))
    with Mesh(spec) as mesh, Client(mesh.router_address) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete([5, 6, 7], max_tokens=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no healthy prefill worker" in err.value.details()


def test_fallback_local_prefills_on_decode_and_counts_it(llama_dir: Path, tmp_path: Path, hf_refs) -> None:  # type: ignore[no-untyped-def]
    spec = MeshSpec(model=str(llama_dir), prefill=0, decode=1, worker_args=WORKER_ARGS,
                    log_dir=str(tmp_path))
    with Mesh(spec) as mesh, Client(mesh.router_address) as c:
        prompt = mixed_prompts(3, seed=71)[2]
        out = c.complete(prompt, max_tokens=6, temperature=0)
        assert out.token_ids == hf_refs["llama"].greedy(prompt, 6)
        stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
        assert stats.local_prefills == 1 and stats.decisions["local/no_prefill"] == 1
        # The decode worker counts the prompt it computed, as a prefill worker would.
        decode = wait_idle(mesh)["decode-0"]
        assert decode.computed_prompt_tokens == out.prompt_tokens - out.cached_tokens > 0




@pytest.mark.parametrize("limit", [["--num-blocks", "8"], ["--max-model-len", "128"]], ids=["pool", "context"])
def test_a_prompt_no_prefill_worker_holds_prefills_on_its_decode_worker(
    llama_dir: Path, tmp_path: Path, hf_refs, limit: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """A prefill worker sized smaller than the decode worker (a pool of 8 blocks of 16
    tokens against 256, or a 128-token context) once answered a 200-token prompt
    INVALID_ARGUMENT, "shorten the prompt", although the mesh could serve it; it now
    prefills on the decode worker, counted by reason."""
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1,
                    worker_args=["--dtype", "float32", "--block-size", "16", "--num-blocks", "256"],
                    prefill_args=limit, router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path))
    long_prompt = [10 + (7 * i) % 900 for i in range(200)]
    short_prompt = mixed_prompts(1, seed=5)[0]
    with Mesh(spec) as mesh, Client(mesh.router_address) as c:
        assert c.complete(long_prompt, max_tokens=4, temperature=0).token_ids == hf_refs["llama"].greedy(long_prompt, 4)
        assert c.complete(short_prompt, max_tokens=3, temperature=0).token_ids == hf_refs["llama"].greedy(short_prompt, 3)
        stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
        assert stats.decisions["local/too_long_for_prefill"] == 1
        assert stats.local_prefills == 1  # the short prompt went to the prefill worker
        state = wait_idle(mesh)
        field = {"--num-blocks": "num_blocks", "--max-model-len": "max_model_len"}[limit[0]]
        assert getattr(state["prefill-0"], field) == int(limit[1])  # what the router routed by
        assert state["prefill-0"].computed_prompt_tokens == len(short_prompt)
        assert state["decode-0"].computed_prompt_tokens == len(long_prompt)
