"""A fresh mesh's first KV write lands within its writer's call.

UCX connects two NIXL agents on their first transfer, and that handshake needs the peer's
progress passes: a request's first write to a decode worker used to be PENDING until the
decode worker polled, and the decode worker then polled every awaited reservation for
``TRUST_S``. The prefill worker now warms each new peer's connection with one-block reads
(``WorkerCore._warm``) while the prompt computes, so even the first write is copied
inside its own call over shared memory.

Without the warm-up the first write waits for the handshake in every mesh. With it, a
write on a loaded machine can still, now and then, finish just after its call (1 of 30
fresh meshes with two busy loops on 2 cores; the mesh's design allows for such odd
writes, ``services/decode/write_path.py``), so the test gives a fresh mesh ``ATTEMPTS``
tries and reports each.
"""

from __future__ import annotations

import random
from pathlib import Path

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.telemetry.scrape import scrape, total
from tests.integration.mesh.conftest import WORKER_ARGS, wait_idle

ATTEMPTS = 3


def first_write(llama_dir: Path, log_dir: Path) -> dict[str, float]:
    """How a fresh 1 + 1 mesh's first request's KV landed on its decode worker."""
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=0, worker_args=WORKER_ARGS,
                    router_args=["--prefill-busy-requests", "0", "--local-prefill-tokens", "0"],
                    log_dir=str(log_dir))
    with Mesh(spec) as mesh, Client(mesh.router_address, timeout=120) as c:
        prompt = [random.Random(11).randrange(5, 1000) for _ in range(128)]
        out = c.complete(prompt, max_tokens=3, temperature=0)
        assert len(out.token_ids) == 3
        wait_idle(mesh)
        prefill = scrape(mesh.prefill[0].metrics_address)
        decode = scrape(mesh.decode[0].metrics_address)
    log = (log_dir / "prefill-0.log").read_text()
    assert total(prefill, "pdmesh_kv_transfer_bytes_total") > 0  # the prompt's KV was written
    assert "warmed by one-block reads" in log, log[-3000:]
    return {path: total(decode, "pdmesh_kv_writes_received_total", path=path) for path in ("inline", "polled")}


def test_the_first_write_to_a_new_decode_worker_lands_inline(llama_dir: Path, tmp_path: Path) -> None:
    seen = []
    for attempt in range(ATTEMPTS):
        log_dir = tmp_path / f"attempt-{attempt}"
        log_dir.mkdir()
        landed = first_write(llama_dir, log_dir)
        if landed == {"inline": 1, "polled": 0}:
            return
        warm = [line for line in (log_dir / "prefill-0.log").read_text().splitlines() if "warmed by" in line]
        seen.append((landed, warm))
    raise AssertionError(f"the first write was not inline in {ATTEMPTS} fresh meshes: {seen}")
