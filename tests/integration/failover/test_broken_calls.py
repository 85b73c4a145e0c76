"""A prefill call and a ``Reserve`` that break mid-call (INTERNAL, as gRPC reports some
broken streams) are tried again: the request is answered exactly, both workers stay in
service, and no block is left, also when the worker had reserved before the answer was
lost. Before, either failure reached the caller as UNAVAILABLE."""

from __future__ import annotations

from pathlib import Path

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.v1 import admin_pb2
from tests.conftest import mixed_prompts
from tests.integration.failover.breaking_proxy import BreakingProxy
from tests.integration.mesh.conftest import WORKER_ARGS, admin, wait_idle


def _route_through(mesh: Mesh, llama_dir: Path, prefill: BreakingProxy, decode: BreakingProxy) -> None:
    """Restart the mesh's router with the proxies in front of its workers."""
    mesh.kill(mesh.router)  # type: ignore[arg-type]
    mesh.router = mesh._spawn("router", [
        "router", "--model", str(llama_dir), "--redis-url", mesh.redis_url,
        "--prefill", prefill.address, "--decode", decode.address, "--info-interval-s", "0.2",
        *mesh._port_args("router")])
    mesh._await_ready(mesh.router)


def _spec(llama_dir: Path, tmp_path: Path) -> MeshSpec:
    return MeshSpec(model=str(llama_dir), prefill=1, decode=1, worker_args=WORKER_ARGS,
                    router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path))


def test_calls_broken_mid_call_are_tried_again(llama_dir: Path, tmp_path: Path, hf_refs) -> None:  # type: ignore[no-untyped-def]
    with Mesh(_spec(llama_dir, tmp_path)) as mesh:
        # r1's prefill call breaks before the worker sees it; r3's answers after the worker
        # computed and wrote its KV, and the answer is lost.
        prefill = BreakingProxy(mesh.prefill[0].address, {"PrefillStream": {"r1"}},
                                breaks_after={"PrefillStream": {"r3"}}, cancel_delay_s=1.0)
        # r1's retry goes local (no Reserve); r2's Reserve breaks before the worker sees it,
        # then its retry's (r2~1) after the worker reserved.
        decode = BreakingProxy(mesh.decode[0].address, {"Reserve": {"r2"}}, breaks_after={"Reserve": {"r2~1"}})
        try:
            _route_through(mesh, llama_dir, prefill, decode)
            prompts = [p for p in mixed_prompts(20, seed=89) if len(p) >= 31][:3]
            with Client(mesh.router_address, timeout=60) as c:
                outs = [c.complete(p, request_id=f"r{i}", max_tokens=6, temperature=0).token_ids
                        for i, p in enumerate(prompts, 1)]
            assert outs == [hf_refs["llama"].greedy(p, 6) for p in prompts]
            assert prefill.broken == ["PrefillStream r1 before", "PrefillStream r3 after"]
            assert decode.broken == ["Reserve r2 before", "Reserve r2~1 after"]
            stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
            assert stats.prefill_retries == 2
            assert stats.decisions["local/no_prefill"] == 2  # the only prefill worker failed them
            workers = admin(mesh).ListWorkers(admin_pb2.ListWorkersRequest()).workers
            assert all(w.healthy for w in workers), workers
            wait_idle(mesh)
        finally:
            prefill.close()
            decode.close()


def test_a_handoff_broken_after_its_first_token_continues_on_the_decode_worker(  # type: ignore[no-untyped-def]
        llama_dir: Path, tmp_path: Path, hf_refs) -> None:
    """The prefill call breaks after the caller has the first token (``PrefillStream``'s
    first answer) and before the KV's: the request is not tried again from the start,
    which would stream that token twice, but continues on the decode worker from it,
    exactly, and no block is left."""
    with Mesh(_spec(llama_dir, tmp_path)) as mesh:
        prefill = BreakingProxy(mesh.prefill[0].address, {}, breaks_between={"PrefillStream": {"r1"}})
        decode = BreakingProxy(mesh.decode[0].address, {})
        try:
            _route_through(mesh, llama_dir, prefill, decode)
            prompt = [p for p in mixed_prompts(20, seed=91) if len(p) >= 31][0]
            with Client(mesh.router_address, timeout=60) as c:
                out = c.complete(prompt, request_id="r1", max_tokens=8, temperature=0)
            assert out.token_ids == hf_refs["llama"].greedy(prompt, 8)
            assert (out.finish_reason, out.completion_tokens) == ("length", 8)
            assert prefill.broken == ["PrefillStream r1 between"]
            stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
            assert stats.prefill_retries == 1
            assert not stats.decisions.get("local/no_prefill")  # continued, not routed again
            wait_idle(mesh)
        finally:
            prefill.close()
            decode.close()
