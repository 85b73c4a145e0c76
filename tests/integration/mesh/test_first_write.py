"""A fresh mesh's first KV write lands within its writer's call.

UCX connects two NIXL agents on their first transfer, and that handshake needs the peer's
progress passes: a request's first write to a decode worker used to be PENDING until the
decode worker polled, and the decode worker then polled every awaited reservation for
``TRUST_S``. The prefill worker now warms each new peer's connection with a one-block
read (``WorkerCore._warm``) while the prompt computes, so even the first write is copied
inside its own call over shared memory.
"""

from __future__ import annotations

import random
from pathlib import Path

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.telemetry.scrape import scrape, total
from tests.integration.mesh.conftest import WORKER_ARGS, wait_idle


def test_the_first_write_to_a_new_decode_worker_lands_inline(llama_dir: Path, tmp_path: Path) -> None:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=0, worker_args=WORKER_ARGS,
                    router_args=["--prefill-busy-requests", "0", "--local-prefill-tokens", "0"],
                    log_dir=str(tmp_path))
    with Mesh(spec) as mesh, Client(mesh.router_address, timeout=120) as c:
        prompt = [random.Random(11).randrange(5, 1000) for _ in range(128)]
        out = c.complete(prompt, max_tokens=3, temperature=0)
        assert len(out.token_ids) == 3
        wait_idle(mesh)
        prefill = scrape(mesh.prefill[0].metrics_address)
        decode = scrape(mesh.decode[0].metrics_address)
    log = (tmp_path / "prefill-0.log").read_text()
    assert total(prefill, "pdmesh_kv_transfer_bytes_total") > 0  # the prompt's KV was written
    assert "warmed by a one-block read" in log, log[-3000:]
    landed = {path: total(decode, "pdmesh_kv_writes_received_total", path=path) for path in ("inline", "polled")}
    assert landed == {"inline": 1, "polled": 0}, (landed, log[-3000:])
