"""A KV write that fails while every worker stays alive.

The write's request is tried again and answered exactly, and the failure is not taken as
the decode worker's death: with one decode worker, marking it down refused every request
routed until the next Info refresh (one failure became many). Caused with the
fault-injecting wrapper around the real transport (``PDMESH_FAULT_TRANSFER_FAIL``): a live
NIXL pair cannot be made to fail one write on demand.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import WORKER_ARGS, admin, wait_idle
from tests.oracle import mixed_prompts


def test_a_failed_kv_write_is_retried_and_the_decode_worker_stays_in_service(
    llama_dir: Path, tmp_path: Path, hf_refs
) -> None:  # type: ignore[no-untyped-def]
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, worker_args=WORKER_ARGS,
                    router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path))
    mesh = Mesh(spec)
    os.environ["PDMESH_FAULT_TRANSFER_FAIL"] = "2,3"  # only the prefill worker writes KV
    try:
        mesh.start()
    finally:
        del os.environ["PDMESH_FAULT_TRANSFER_FAIL"]
    try:
        prompts = [p for p in mixed_prompts(40, seed=83) if len(p) >= 17][:12]

        def one(prompt: list[int]) -> list[int]:
            with Client(mesh.router_address, timeout=60) as c:
                return c.complete(prompt, max_tokens=6, temperature=0).token_ids

        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(one, prompts))
        assert outs == [hf_refs["llama"].greedy(p, 6) for p in prompts]
        router_log = mesh.router.log.read_text()  # type: ignore[union-attr]
        assert router_log.count("failed kv transfer") == 2, router_log[-3000:]
        workers = admin(mesh).ListWorkers(admin_pb2.ListWorkersRequest()).workers
        assert [w.healthy for w in workers if w.role == "decode"] == [True]
        assert "stopped answering" not in router_log
        wait_idle(mesh)
    finally:
        mesh.stop()
