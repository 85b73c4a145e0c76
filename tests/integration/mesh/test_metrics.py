"""/metrics on every service, parsed with prometheus_client's own parser."""

from __future__ import annotations

import random
import time

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from pdmesh.telemetry.scrape import scrape, total
from tests.integration.mesh_tools import wait_idle


def test_metrics_agree_with_the_run(mesh: Mesh, client: Client) -> None:
    router = mesh.router
    assert router is not None and router.metrics_address
    before = scrape(router.metrics_address)
    rng = random.Random(101)
    prefix = [rng.randrange(5, 1000) for _ in range(64)]
    n = 6
    for i in range(n):
        out = client.complete(prefix + [rng.randrange(5, 1000) for _ in range(8)], max_tokens=3,
                              temperature=0)
        assert len(out.token_ids) == 3
        if i == 0:
            time.sleep(0.3)
    after = scrape(router.metrics_address)
    sent = total(after, "pdmesh_requests_total", role="router") - total(before, "pdmesh_requests_total", role="router")
    assert sent == n
    ttft = total(after, "pdmesh_time_to_first_token_seconds_count", role="router") - total(
        before, "pdmesh_time_to_first_token_seconds_count", role="router")
    assert ttft == n
    assert total(after, "pdmesh_routing_decisions_total", policy="cache_aware") >= n
    # every prefill decision read the index, from the router's mirror once it had read it
    assert total(after, "pdmesh_index_lookups_total") >= n
    assert total(after, "pdmesh_index_mirror_current") == 1
    assert total(after, "pdmesh_index_lookups_total", source="mirror") > 0
    assert total(after, "pdmesh_worker_healthy") >= 3
    wait_idle(mesh)
    for proc in [*mesh.prefill, *mesh.decode]:
        m = scrape(proc.metrics_address)
        assert total(m, "pdmesh_orphan_kv_blocks") == 0, proc.name
        assert total(m, "pdmesh_kv_blocks", state="used") == 0, proc.name
    prefill = [scrape(p.metrics_address) for p in mesh.prefill]
    assert max(total(m, "pdmesh_prefix_cache_hit_rate") for m in prefill) > 0
    assert sum(total(m, "pdmesh_kv_transfer_bytes_total") for m in prefill) > 0
    # KV written over shared memory lands within the writer's call: the decode worker was
    # told so with every Decode (and stops polling for awaited KV after a run of them)
    decode = scrape(mesh.decode[0].metrics_address)
    assert total(decode, "pdmesh_kv_writes_received_total", path="inline") >= n - 1
    store = scrape(mesh.kvstore[0].metrics_address)
    assert total(store, "pdmesh_kvstore_blocks", state="stored") > 0
