"""The cost model's choices on constructed states: each assertion is the exact worker the
estimate of time to first token must pick, and why."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from pdmesh.kv.block_hash import BlockHasher
from pdmesh.mesh_types import WorkerInfo
from services.router.policies.base import RouteContext
from services.router.policies.cache_aware import CacheAwarePolicy
from services.router.policies.prefix_hash import rendezvous_pick, ring_pick
from services.router.worker_handle import WorkerHandle

BS = 16
PROMPT = 1024
HASHES = BlockHasher(BS).hash_tokens(list(range(PROMPT)))  # 64 full blocks
POLICY = CacheAwarePolicy(us_per_token=100.0, kvstore_ratio=0.1, tolerance=0.3)


def worker(i: int, pending: int = 0, us: float = 0.0, kv_us: float = 0.0) -> WorkerHandle:
    w = WorkerHandle(f"127.0.0.1:{9000 + i}", "prefill", healthy=True)
    w.info = WorkerInfo(worker_id=f"p{i}", prefill_us_per_token=us, kvstore_us_per_token=kv_us)
    w.pending_tokens = pending
    return w


def ctx(matched: dict[str, int] | None, tier: int = 0, recurring: bool = True) -> RouteContext:
    return RouteContext(HASHES, HASHES[0], matched, BS, tier, PROMPT, recurring=recurring)


def test_an_idle_holder_wins_and_reports_its_cached_tokens() -> None:
    d = POLICY.choose([worker(0), worker(1)], ctx({"p1": 48}))
    assert (d.worker.worker_id, d.reason, d.cached_tokens) == ("p1", "hit", 768)


def test_the_holder_wins_while_its_queue_costs_less_than_recomputing() -> None:
    # p0 holds 768 tokens: 256 to compute there vs 1024 on idle p1. Behind 767 queued
    # tokens it is still ahead (1023 < 1024); behind 769 it is not.
    exact = CacheAwarePolicy(us_per_token=100.0, kvstore_ratio=0.1, tolerance=0.0)
    assert exact.choose([worker(0, pending=767), worker(1)], ctx({"p0": 48})).worker.worker_id == "p0"
    d = exact.choose([worker(0, pending=769), worker(1)], ctx({"p0": 48}))
    assert (d.worker.worker_id, d.reason, d.cached_tokens) == ("p1", "balance", 0)
    # Within a 30% tolerance the holder keeps it up to 1.3 x 1024 = 1331.2 tokens of
    # estimate: 1075 queued, not 1076.
    assert POLICY.choose([worker(0, pending=1075), worker(1)], ctx({"p0": 48})).worker.worker_id == "p0"
    assert POLICY.choose([worker(0, pending=1076), worker(1)], ctx({"p0": 48})).worker.worker_id == "p1"


def test_cost_noise_between_equal_workers_does_not_steer_new_prefixes() -> None:
    # Two workers measuring 600 and 640 us/token (the same machine, noisy): new prefixes
    # spread by rendezvous hashing instead of all going to the one that measured lower.
    a, b = worker(0, us=600.0), worker(1, us=640.0)
    picks = {POLICY.choose([a, b], RouteContext(h, h[0], {}, BS, 0, PROMPT)).worker.worker_id
             for h in (BlockHasher(BS, seed=i).hash_tokens(list(range(PROMPT))) for i in range(16))}
    assert picks == {"p0", "p1"}
    # ...and a small holder on the dearer worker keeps its prefix.
    d = POLICY.choose([a, b], ctx({"p1": 2}))
    assert (d.worker.worker_id, d.reason, d.cached_tokens) == ("p1", "hit", 32)


def test_queued_tokens_not_request_counts_decide_a_miss() -> None:
    few_long = worker(0, pending=3000)
    many_short = worker(1, pending=2000)
    many_short.in_flight = 40
    assert POLICY.choose([few_long, many_short], ctx({})).worker is many_short


def test_a_worker_reporting_more_queued_work_than_ours_counts_the_report() -> None:
    w0, w1 = worker(0), worker(1, pending=100)
    w0.info = replace(w0.info, queued_prefill_tokens=500)  # type: ignore[arg-type]
    w0.info_at, w0.released_at = 2.0, 1.0
    assert POLICY.choose([w0, w1], ctx({})).worker is w1
    w0.released_at = 3.0  # the report predates one of our completions: not trusted
    assert w0.queued_tokens == 0


def test_measured_costs_replace_the_defaults() -> None:
    # p0 holds half the prompt but computes at 400 us/token (512 * 400 = 205 ms); p1 holds
    # nothing at 150 us/token (1024 * 150 = 154 ms).
    slow, fast = worker(0, us=400.0), worker(1, us=150.0)
    assert POLICY.choose([slow, fast], ctx({"p0": 32})).worker is fast


def test_the_kvstore_is_priced_per_fetched_token() -> None:
    # The store holds 48 blocks. Fetching 768 tokens at 10 us each plus computing 256
    # beats p1 holding 16 blocks (768 tokens to compute) when both are idle.
    d = POLICY.choose([worker(0), worker(1)], ctx({"p1": 16}, tier=48))
    assert (d.worker.worker_id, d.cached_tokens) == ("p1", 1024 - 256)  # 256 cached + 512 fetched
    # A fetch measured as dearer than computing is never preferred to a local hit.
    d = POLICY.choose([worker(0, kv_us=500.0), worker(1, kv_us=500.0)], ctx({"p1": 16}, tier=48))
    assert d.worker.worker_id == "p1"


def test_equal_estimates_follow_rendezvous_hashing_and_index_down_the_ring() -> None:
    ws = [worker(i) for i in range(4)]
    assert POLICY.choose(ws, ctx({})).worker is rendezvous_pick(ws, HASHES[0])
    assert POLICY.choose(list(reversed(ws)), ctx({})).worker is rendezvous_pick(ws, HASHES[0])
    d = POLICY.choose(ws, ctx(None))
    assert (d.worker, d.reason) == (ring_pick(ws, HASHES[0]), "index_down")


def test_a_never_seen_prompt_near_several_workers_goes_to_the_one_that_frees_up_first() -> None:
    # None of the prompt is anywhere and every estimate is within the tolerance (2,048,
    # 1,924 and 2,024 tokens). A first sighting goes to the fewest queued tokens, then, of
    # equal queues, to the worker whose work in progress began first: hashing would place
    # it at random, behind round robin on uniform traffic.
    a, b, c = worker(0, pending=1024), worker(1, pending=900), worker(2, pending=1000)
    assert POLICY.choose([a, b, c], ctx({}, recurring=False)).worker is b
    b.pending_tokens = c.pending_tokens = 1024
    a.started_at, b.started_at, c.started_at = 5.0, 3.0, 4.0
    assert POLICY.choose([a, b, c], ctx({}, recurring=False)).worker is b
    b.started_at = 6.0
    d = POLICY.choose([a, b, c], ctx({}, recurring=False))
    assert (d.worker, d.reason) == (c, "miss")
    # A prefix that came by before keeps its hashed home in the same state, even though
    # every cache dropped it: that is what keeps it on one worker.
    assert POLICY.choose([a, b, c], ctx({})).worker is rendezvous_pick([a, b, c], HASHES[0])
    # Idle workers are all equally free: hashing among them either way.
    idle = [worker(i) for i in range(4)]
    assert POLICY.choose(idle, ctx({}, recurring=False)).worker is rendezvous_pick(idle, HASHES[0])


def test_started_at_is_when_the_work_in_progress_began() -> None:
    w = worker(0)
    w.acquire(256, now=1.0)  # idle: this request starts now
    w.acquire(256, now=2.0)  # queued behind it: the work in progress began at 1.0
    assert w.started_at == 1.0
    w.release(256, now=3.0)  # the first finished, the second began
    assert (w.started_at, w.released_at, w.pending_tokens) == (3.0, 3.0, 256)


@pytest.mark.parametrize("n", [1, 3, 1000])
def test_ring_pick_is_stable_across_candidate_orders(n: int) -> None:
    ws = [worker(i) for i in range(n)]
    assert ring_pick(ws, b"k").worker_id == ring_pick(list(reversed(ws)), b"k").worker_id


def test_at_scale_holders_are_always_considered_and_others_sampled() -> None:
    ws = [worker(i, pending=5000) for i in range(1000)]
    ws[999].pending_tokens = 500
    ws[700].pending_tokens = 0  # the only idle worker
    policy = CacheAwarePolicy(us_per_token=100.0, kvstore_ratio=0.1, tolerance=0.3)
    policy.rng = random.Random(0)
    d = policy.choose(ws, ctx({"p999": 64}))  # the holder (500 queued) beats even the idle one
    assert (d.worker.worker_id, d.reason) == ("p999", "hit")
    # Without a holder, 32 of the 1,000 are compared: the idle worker wins when sampled
    # (about 1 decision in 31), and otherwise the least busy of the sample.
    picks = [policy.choose(ws, ctx({})).worker for _ in range(310)]
    assert 3 <= sum(w is ws[700] for w in picks) <= 25
    assert sum(w is ws[999] for w in picks) >= 3


def test_a_worker_that_has_not_measured_is_priced_like_its_measured_peers() -> None:
    # Default 100 us/token; the fleet measures 600. A fresh worker priced at the default
    # would look 6x cheaper than a holder of half the prompt and take it.
    policy = CacheAwarePolicy(us_per_token=100.0, kvstore_ratio=0.1, tolerance=0.3)
    measured, fresh = worker(0, us=600.0), worker(1)
    assert policy.choose([measured, fresh], ctx({"p0": 32})).worker is measured
    assert policy.costs(fresh, policy.assumed_cost([measured, fresh]))[0] == pytest.approx(600e-6)
    assert policy.assumed_cost([fresh]) == pytest.approx(100e-6)  # nobody measured: the default
    # The decision does not depend on the order the workers are listed in.
    assert policy.choose([fresh, measured], ctx({"p0": 32})).worker is measured
