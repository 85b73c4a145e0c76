"""A prefill call and a ``Reserve`` that break mid-call (INTERNAL, as gRPC reports some
broken streams) are tried again: the request is answered exactly, both workers stay in
service, and no block is left, also when the worker had reserved before the answer was
lost. Before, either failure reached the caller as UNAVAILABLE."""

from __future__ import annotations

from pathlib import Path

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from pdmesh.v1 import admin_pb2
from tests.integration.failover.breaking_proxy import BreakingProxy
from tests.integration.mesh_tools import admin, small_spec, wait_idle
from tests.oracle import mixed_prompts


def test_calls_broken_mid_call_are_tried_again(llama_dir: Path, tmp_path: Path, hf_refs) -> None:  # type: ignore[no-untyped-def]
    with Mesh(small_spec(llama_dir, tmp_path)) as mesh:
        # r1's prefill call breaks before the worker sees it; r3's answers after the worker
        # computed and wrote its KV, and the answer is lost.
        prefill = BreakingProxy(mesh.prefill[0].address, {"PrefillStream": {"r1"}},
                                breaks_after={"PrefillStream": {"r3"}}, cancel_delay_s=1.0)
        # r1's retry goes local (no Reserve); r2's Reserve breaks before the worker sees it,
        # then its retry's (r2~1) after the worker reserved.
        decode = BreakingProxy(mesh.decode[0].address, {"Reserve": {"r2"}}, breaks_after={"Reserve": {"r2~1"}})
        try:
            mesh.restart_router(prefill=[prefill.address], decode=[decode.address])
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
    with Mesh(small_spec(llama_dir, tmp_path)) as mesh:
        prefill = BreakingProxy(mesh.prefill[0].address, {}, breaks_between={"PrefillStream": {"r1"}})
        decode = BreakingProxy(mesh.decode[0].address, {})
        try:
            mesh.restart_router(prefill=[prefill.address], decode=[decode.address])
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
