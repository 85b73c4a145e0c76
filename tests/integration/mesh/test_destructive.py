"""The tests that break what the shared mesh stands on (Redis stopped, every prefill cache
flooded) run on a mesh of their own, so that no other test's outcome depends on whether
they ran before it."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from pdmesh.client import Client
from pdmesh.index import keys
from pdmesh.launcher import Mesh
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import admin, infos, kvstore_lookups, shared_spec
from tests.oracle import mixed_prompts


@pytest.fixture(scope="module")
def mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with Mesh(shared_spec(llama_dir, tmp_path_factory.mktemp("destructive-logs"))) as m:
        yield m


def test_requests_survive_redis_going_away_and_the_index_refills(mesh: Mesh, client: Client) -> None:
    port = mesh.redis_port
    mesh.stop_redis()
    try:
        before = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest()).index_fallbacks
        # At least one full block each, so every request asks the index.
        prompts = [p + [9] * 16 for p in mixed_prompts(6, seed=51)]
        outs = [client.complete(p, max_tokens=4, temperature=0) for p in prompts]
        assert all(len(o.token_ids) == 4 for o in outs)
        stats = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest())
        assert stats.index_fallbacks - before == 6
    finally:
        mesh.start_redis(port)
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 15
    while not (r.keys(keys.BLOCK_KEYS) and r.keys("pdmesh:hb:*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.keys(keys.BLOCK_KEYS), "the prefill workers did not republish their prefix caches"
    assert r.keys("pdmesh:hb:*"), "no heartbeats after Redis came back"


def test_evicted_prefix_is_fetched_from_the_kvstore_not_recomputed(mesh: Mesh, client: Client) -> None:
    rng = random.Random(81)
    prefix = [rng.randrange(5, 1000) for _ in range(128)]  # 8 full blocks
    client.complete(prefix + [11, 12, 13], max_tokens=2, temperature=0)
    deadline = time.monotonic() + 10  # offload runs after the response
    while sum(i.kvstore_offloaded_blocks for i in infos(mesh).values()) < 8:
        assert time.monotonic() < deadline, "the prefix never reached the kvstore"
        time.sleep(0.1)
    # Flood both prefill workers (256 blocks each) with ~4.5x their capacity of other
    # prompts, so that even a lopsided split of the flood evicts the prefix on both.
    fillers = [[rng.randrange(5, 1000) for _ in range(150)] for _ in range(120)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.complete(p, max_tokens=1, temperature=0), fillers))
    before, asked = infos(mesh), kvstore_lookups(mesh)
    out = client.complete(prefix + [21, 22, 23], max_tokens=2, temperature=0)
    after = infos(mesh)
    fetched = sum(after[n].kvstore_fetched_tokens - before[n].kvstore_fetched_tokens for n in after)
    computed = sum(after[n].computed_prompt_tokens - before[n].computed_prompt_tokens for n in after)
    assert fetched == 128
    assert computed == len(prefix) + 3 - 128  # only the suffix was computed
    assert out.cached_tokens >= 128
    # The index listed the prefix in the kvstore: the prefill worker asked it.
    assert kvstore_lookups(mesh)["asked"] - asked["asked"] == 1
