"""32 concurrent 1,500-token prompts on a 2-prefill mesh: long prefill queues delay requests,
never fail them (the decode reservations' leases are renewed while they wait); exact."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from tests.integration.mesh_tools import info
from tests.oracle import HFReference


@pytest.mark.slow
def test_32_long_prompts_all_complete_exactly(llama_dir: Path, tmp_path: Path, hf_refs) -> None:  # type: ignore[no-untyped-def]
    ref: HFReference = hf_refs["llama"]
    rng = random.Random(91)
    prompts = [[rng.randrange(5, 1000) for _ in range(1500)] for _ in range(32)]
    spec = MeshSpec(model=str(llama_dir), prefill=2, decode=1,
                    worker_args=["--dtype", "float32", "--num-blocks", "3400", "--threads", "1"],
                    # Small prefill steps and a short lease: each request waits in a prefill
                    # queue for several lease periods.
                    prefill_args=["--max-num-batched-tokens", "256"],
                    router_args=["--lease-ms", "1500", "--info-interval-s", "0.2"],
                    log_dir=str(tmp_path / "logs"))
    with Mesh(spec) as mesh, Client(mesh.router_address, timeout=300) as c:
        with ThreadPoolExecutor(32) as pool:
            outs = list(pool.map(lambda p: c.complete(p, max_tokens=4, temperature=0), prompts))
        got = info(mesh.decode[0].address)
    assert [o.token_ids for o in outs] == [ref.greedy(p, 4) for p in prompts]
    assert got.expired_leases == 0 and got.used_blocks == 0
