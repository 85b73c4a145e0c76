"""The routing simulator: the oracle, the policies it compares, and that it predicts a real
mesh's prefix-cache hit rate (same traffic, same pool sizes, same router code)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from pdmesh.bench.routing.sim import SimSpec, simulate
from pdmesh.bench.routing.traffic import TrafficSpec, build_traffic
from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.v1 import admin_pb2, admin_pb2_grpc
from tests.integration.mesh_tools import info

BS = 16


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    m = Mesh(MeshSpec(model="sim", log_dir=str(tmp_path_factory.mktemp("redis"))))
    m.start_redis()
    try:
        yield m.redis_url
    finally:
        m.stop_redis()


def test_the_oracle_computes_each_block_once() -> None:
    traffic = build_traffic(TrafficSpec(num_requests=12, groups=2, prefix_len=64, suffix_len=8,
                                        chat_share=0.5, turns=3, turn_len=8, output_len=8))
    assert len(traffic.jobs) == 12 and sum(j.turn == 0 for j in traffic.jobs) == len(traffic.starts)
    for job in traffic.jobs:  # a turn extends the previous one
        if job.next_turn is not None:
            assert job.next_turn.tokens[: len(job.tokens)] == job.tokens
    # Each distinct full block once, plus every prompt's partial tail.
    tails = sum(len(j.tokens) % BS for j in traffic.jobs)
    assert traffic.oracle_computed(BS) == traffic.unique_blocks(BS) * BS + tails


def test_cache_aware_computes_near_the_oracle_where_round_robin_cannot(redis_url: str) -> None:
    traffic = build_traffic(TrafficSpec(num_requests=400, groups=16, prefix_len=256, suffix_len=32,
                                        turns=3, turn_len=16, output_len=16))
    spec = SimSpec(prefill_workers=8, block_size=BS, s_per_token=500e-6, overhead_s=0.005, load=0.7)
    computed, p90 = {}, {}
    for policy in ("round_robin", "cache_aware"):
        r = simulate(policy, traffic, spec, redis_url)
        assert len(r.served) == len(traffic.jobs)
        assert r.indexed_blocks > 0  # the real index was used
        computed[policy] = sum(len(s.job.tokens) - s.cached - s.fetched for s in r.served)
        p90[policy] = sorted(s.done - s.arrival for s in r.served)[int(0.9 * len(r.served))]
    assert computed["cache_aware"] <= 1.2 * r.oracle_computed
    assert computed["round_robin"] > 2 * computed["cache_aware"]
    assert p90["round_robin"] > 2 * p90["cache_aware"]


def index_settled(url: str, quiet_s: float = 0.1, timeout_s: float = 10.0) -> None:
    """Wait until no worker's event batch number has moved for ``quiet_s``. The simulator's
    index changes as each request is served, a real worker's some 20 ms later and much
    later on a loaded machine: next to two busy processes the real mesh's hit rate was
    0.543 against the simulator's 0.717 (as in one CI run), 0.670-0.724 with this wait."""
    with redis.Redis.from_url(url) as r:
        seqs = r.mget(r.keys("pdmesh:seq:*"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = r.mget(r.keys("pdmesh:seq:*"))
            if now == seqs:
                return
            seqs = now
    raise AssertionError("the prefix index never settled")


def test_the_simulator_predicts_a_real_meshs_hit_rate(llama_dir: Path, redis_url: str,
                                                     tmp_path: Path) -> None:
    """Two prefill workers with small pools (cache pressure), requests one at a time in
    the order the simulator served them: the hit rates agree within 10%."""
    traffic = build_traffic(TrafficSpec(num_requests=30, groups=4, prefix_len=128, suffix_len=24,
                                        chat_share=0.3, turns=3, turn_len=16, output_len=8, vocab=1000))
    pool = int(0.3 * traffic.unique_blocks(BS))
    spec = SimSpec(prefill_workers=2, pool_blocks=pool, block_size=BS, s_per_token=500e-6,
                   overhead_s=0.005, load=0.05)
    sim = simulate("cache_aware", traffic, spec, redis_url)
    order = sorted(sim.served, key=lambda s: s.arrival)
    prompt = sum(len(s.job.tokens) for s in order)
    sim_hit = sum(s.cached for s in order) / prompt

    mesh_spec = MeshSpec(model=str(llama_dir), prefill=2, decode=1, kvstore=0,
                         worker_args=["--dtype", "float32", "--block-size", str(BS), "--num-blocks", "256"],
                         prefill_args=["--num-blocks", str(pool)],
                         # The simulator prices every worker alike; real workers measure their
                         # own costs, which a loaded machine skews past the default tolerance,
                         # and that, not the cache, then decides where a miss goes.
                         router_args=["--info-interval-s", "0.2", "--route-tolerance", "10"],
                         log_dir=str(tmp_path / "logs"))
    with Mesh(mesh_spec) as mesh, Client(mesh.router_address, timeout=120) as client:
        for s in order:
            client.complete(s.job.tokens, max_tokens=1)
            index_settled(mesh.redis_url)
        # What the prefill workers found in their own caches (the decode worker keeps
        # prompts too, but the simulator models the prefill side).
        cached = sum(info(p.address).cached_prompt_tokens for p in mesh.prefill)
        with grpc.insecure_channel(mesh.router_address) as ch:
            decisions = dict(admin_pb2_grpc.MeshAdminStub(ch).RouterStats(admin_pb2.RouterStatsRequest()).decisions)
    real_hit = cached / prompt
    print(f"prefill hit rate: simulated {sim_hit:.3f}, real mesh {real_hit:.3f}")
    assert sim_hit > 0 and abs(sim_hit - real_hit) <= 0.1 * real_hit, (sim_hit, real_hit, decisions)


@pytest.mark.parametrize("policy", ["reuse", "lru"])
def test_a_simulated_worker_caches_as_the_engine_and_publishes_what_it_holds(redis_url: str, policy: str) -> None:
    """Under cache pressure (a pool of 3 prefixes' worth for 6 Zipf-popular ones), a
    simulated worker's prompts find the hits the engine's own cache gives them (the last
    token always computed), and the index lists for it exactly the blocks it holds."""
    import asyncio
    import random

    from pdmesh.bench.routing.workers import EnginePool
    from pdmesh.index.lookup import PrefixIndex
    from pdmesh.index.publisher import IndexPublisher
    from pdmesh.kv.block_hash import BlockHasher

    hasher, rng, size = BlockHasher(BS), random.Random(5), 3 * 8 + 6
    prefixes = [[rng.randrange(10, 1000) for _ in range(8 * BS)] for _ in range(6)]
    prompts = [rng.choices(prefixes, [1 / (k + 1) for k in range(6)])[0] + [rng.randrange(10, 1000)
                                                                              for _ in range(2 * BS)]
               for _ in range(300)]

    async def main() -> None:
        publisher = IndexPublisher(redis_url, f"pool-{policy}", "e0", "sim")
        pool, index = EnginePool(size, publisher, hasher, policy), PrefixIndex(redis_url)  # type: ignore[arg-type]
        hits = misses = 0
        try:
            for i, tokens in enumerate(prompts):
                hashes = hasher.hash_tokens(tokens)
                held = pool.held(hashes)
                assert (await index.longest_prefix(hashes)).get((f"pool-{policy}", "e0"), 0) == held, i
                found = await pool.serve(f"r{i}", tokens)
                assert found == min(held, (len(tokens) - 1) // BS), i
                hits += found
                misses += held < 8
            assert pool.kv.pool.stats().used == 0  # every request's blocks freed
        finally:
            await publisher.redis.aclose()
            await index.close()
        assert 0 < hits < 8 * len(prompts) and misses  # some hits, some prefixes not (or no longer) cached

    asyncio.run(main())
