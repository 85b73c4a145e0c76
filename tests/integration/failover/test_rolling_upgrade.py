"""A prefill worker from before ``PrefillStream`` answered twice (the first token alone,
then the whole answer after the KV write) answers once, after the write: during a rolling
upgrade the router serves through it exactly, also when that first token ends the request,
and leaves no block anywhere."""

from __future__ import annotations

from pathlib import Path

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from tests.integration.failover.breaking_proxy import BreakingProxy
from tests.integration.mesh_tools import small_spec, wait_idle
from tests.oracle import mixed_prompts


def test_a_prefill_worker_that_answers_once_serves_exactly(llama_dir: Path, tmp_path: Path, hf_refs) -> None:  # type: ignore[no-untyped-def]
    with Mesh(small_spec(llama_dir, tmp_path)) as mesh:
        prefill = BreakingProxy(mesh.prefill[0].address, {}, answers_once={"PrefillStream": {"r1", "r2"}})
        decode = BreakingProxy(mesh.decode[0].address, {})
        try:
            mesh.restart_router(prefill=[prefill.address], decode=[decode.address])
            prompts = [p for p in mixed_prompts(20, seed=93) if len(p) >= 31][:2]
            with Client(mesh.router_address, timeout=60) as c:
                long = c.complete(prompts[0], request_id="r1", max_tokens=6, temperature=0)
                one = c.complete(prompts[1], request_id="r2", max_tokens=1, temperature=0)  # no Decode at all
            assert long.token_ids == hf_refs["llama"].greedy(prompts[0], 6)
            assert one.token_ids == hf_refs["llama"].greedy(prompts[1], 1) and one.finish_reason == "length"
            assert prefill.broken == ["PrefillStream r1 once", "PrefillStream r2 once"]
            wait_idle(mesh)
        finally:
            prefill.close()
            decode.close()
