"""``pdmesh bench route-mesh``: the routing policies on a real mesh, with Poisson arrivals.

The simulator's traffic (``traffic.py``: skewed shared prefixes, growing conversations)
sent over gRPC to a real mesh of ``--prefill`` prefill workers and one decode worker
whose prefill pools hold less than the traffic's shared prefixes together but more than
any one pool alone (cache pressure). Every (load, policy) gets a fresh mesh, so every
policy starts from empty caches. What a policy cost is read from the workers themselves
(``Info``: prompt tokens computed, found in their own prefix cache, fetched from the
kvstore), not inferred by the client.

Capacity is measured, not assumed: the rate at which the mesh served the whole traffic
sent at once under ``--capacity-policy`` (cache_aware, the default policy), with
conversations' turns back to back. Loads are fractions of it, as in the simulator, so a
policy that recomputes more than its share is overloaded at a load another sustains.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pdmesh.bench.routing import report
from pdmesh.bench.routing.traffic import Job, Traffic, TrafficSpec, build_traffic
from pdmesh.bench.serve.targets import GrpcTarget, Record
from pdmesh.bench.stats import pct

POLICIES = "round_robin,least_loaded,cache_aware"


@dataclass(frozen=True)
class MeshRunSpec:
    model: str
    dtype: str = "float32"
    prefill: int = 2
    decode: int = 1
    block_size: int = 16
    pool_factor: float = 1.2
    """All prefill pools together / the traffic's shared-prefix blocks (plus room for the
    prompts in flight): below ``prefill`` x 1, no pool holds every prefix."""
    inflight_prompts: int = 2
    """Prompts' worth of blocks each prefill pool gets beyond its share of the prefixes."""
    kvstore: bool = False
    think_s: float = 1.0
    """Mean pause (exponential) between a conversation's answer and its next turn."""
    slo_s: float = 2.0
    seed: int = 0
    prefill_args: tuple[str, ...] = ()
    """Extra flags for the prefill workers (e.g. a smaller ``--max-num-batched-tokens``)."""
    router_args: tuple[str, ...] = ()
    """Extra flags for the router under every policy (e.g. ``--local-prefill-tokens``)."""


@dataclass
class WorkerCounts:
    computed: int
    cached: int
    fetched: int
    kv_bytes_sent: int = 0
    """KV written to decode workers (a decode worker holding a conversation's earlier
    turns receives only the new blocks)."""
    role: str = "prefill"
    """A decode worker's ``computed`` is its local prefills' (``--router-arg`` rules); its
    ``cached`` also counts what prefill workers sent, so only ``computed`` is read."""

    def minus(self, other: WorkerCounts) -> WorkerCounts:
        return WorkerCounts(self.computed - other.computed, self.cached - other.cached,
                            self.fetched - other.fetched, self.kv_bytes_sent - other.kv_bytes_sent, self.role)


def prefill_pool_blocks(traffic: Traffic, spec: MeshRunSpec) -> int:
    """Each prefill worker's pool: its share of ``pool_factor`` x the shared prefixes' blocks,
    plus room for ``inflight_prompts`` of the longest prompt."""
    prefix_blocks = traffic.spec.groups * (traffic.spec.prefix_len // spec.block_size)
    longest = max(len(j.tokens) for j in traffic.jobs) // spec.block_size + 1
    return int(spec.pool_factor * prefix_blocks / spec.prefill) + spec.inflight_prompts * longest


def _decisions(metrics_address: str) -> dict[str, int]:
    """The router's routing decisions by reason (``pdmesh_routing_decisions``), e.g.
    ``{"cache_aware/balance": 12}``: why each request went where it went; and its index
    lookups by what answered them (``pdmesh_index_lookups``), e.g. ``{"index/mirror": 480}``."""
    from pdmesh.telemetry.scrape import scrape

    out: dict[str, int] = {}
    for (name, labels), value in scrape(metrics_address, timeout=10).items():
        label = dict(labels)
        if name == "pdmesh_routing_decisions_total":
            out[f"{label['policy']}/{label['reason']}"] = int(value)
        elif name == "pdmesh_index_lookups_total":
            out[f"index/{label['source']}"] = int(value)
    return out


def decode_pool_blocks(traffic: Traffic, spec: MeshRunSpec) -> int:
    """Room on the decode worker for every start at once (the capacity run sends them so):
    a decode worker without room refuses a request (RESOURCE_EXHAUSTED), and routing is
    what this compares."""
    longest = max(len(j.tokens) + j.output_len for j in traffic.jobs) // spec.block_size + 1
    return max(2048, len(traffic.starts) * longest)


async def _counts(addresses: list[tuple[str, str]]) -> list[WorkerCounts]:
    """``(address, role)`` -> each worker's counters."""
    from pdmesh.rpc.clients import fetch_info

    infos = [(await fetch_info(a, timeout=10), role) for a, role in addresses]
    return [WorkerCounts(i.computed_prompt_tokens, i.cached_prompt_tokens, i.kvstore_fetched_tokens, i.kv_bytes_sent,
                         role) for i, role in infos]


async def drive(address: str, traffic: Traffic, rate: float, think_s: float, seed: int
                ) -> tuple[dict[int, Record], float]:
    """Send every job: first turns and independent requests at Poisson ``rate`` of starts
    (inf: all at once), each conversation's next turn ``think_s`` (mean, exponential) after
    its previous answer. Returns each job's record and the wall time of the whole run.
    Arrival gaps and think times are drawn apart (each job's from its own seed), so every
    policy sees the same arrivals whatever order its requests finish in."""
    rng = random.Random(seed)
    target = GrpcTarget(address)
    records: dict[int, Record] = {}
    pending: set[asyncio.Task[None]] = set()

    async def one(job: Job) -> None:
        rec = records[job.index] = Record(time.perf_counter(), prompt_tokens=len(job.tokens))
        await target.send(job.tokens, job.output_len, rec)
        if job.next_turn is not None:
            pause = random.Random(seed * 1_000_003 + job.index).expovariate(1 / think_s) if think_s > 0 else 0.0
            spawn(job.next_turn, pause)

    def spawn(job: Job, delay: float) -> None:
        async def later() -> None:
            if delay:
                await asyncio.sleep(delay)
            await one(job)

        task = asyncio.create_task(later())
        pending.add(task)
        task.add_done_callback(pending.discard)

    start = time.perf_counter()
    try:
        for job in traffic.starts:
            spawn(job, 0.0)
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        while pending:
            await asyncio.gather(*list(pending))
    finally:
        await target.close()
    return records, time.perf_counter() - start


def run_policy(traffic: Traffic, spec: MeshRunSpec, policy: str, starts_rate: float, log_dir: str = "",
               decode_policy: str = "holder") -> tuple[dict[int, Record], float, list[WorkerCounts], dict[str, int]]:
    """One fresh mesh, one policy: the records, the run's seconds, what each prefill
    worker computed / found cached / fetched during it, and the router's decisions."""
    from pdmesh.launcher import Mesh, MeshSpec

    pool = prefill_pool_blocks(traffic, spec)
    worker = ["--dtype", spec.dtype, "--block-size", str(spec.block_size)]
    mesh_spec = MeshSpec(model=spec.model, prefill=spec.prefill, decode=spec.decode, kvstore=int(spec.kvstore),
                         worker_args=worker, prefill_args=["--num-blocks", str(pool), *spec.prefill_args],
                         decode_args=["--num-blocks", str(decode_pool_blocks(traffic, spec))],
                         router_args=["--prefill-policy", policy, "--decode-policy", decode_policy,
                                      "--info-interval-s", "0.2", *spec.router_args],
                         log_dir=log_dir, share_cores=False)
    # Fixed core shares: a worker lending its share measures cheaper and draws the work
    # (tests/integration/mesh/conftest.py); this compares routing, not lending.
    with Mesh(mesh_spec) as mesh:
        addresses = [(p.address, "prefill") for p in mesh.prefill] + [(d.address, "decode") for d in mesh.decode]
        warm = build_traffic(TrafficSpec(num_requests=2, groups=1, prefix_len=16, suffix_len=16, chat_share=0,
                                         output_len=2, vocab=traffic.spec.vocab, seed=traffic.spec.seed + 99))

        async def measure() -> tuple[dict[int, Record], float, list[WorkerCounts], list[WorkerCounts]]:
            await drive(mesh.router_address, warm, float("inf"), 0.0, spec.seed)
            before = await _counts(addresses)
            records, seconds = await drive(mesh.router_address, traffic, starts_rate, spec.think_s, spec.seed)
            return records, seconds, before, await _counts(addresses)

        records, seconds, before, after = asyncio.run(measure())  # one loop: gRPC channels bind to it
        decisions = _decisions(mesh.router.metrics_address) if mesh.router is not None else {}
    return records, seconds, [a.minus(b) for a, b in zip(after, before, strict=True)], decisions


def summarize(policy: str, load: float, traffic: Traffic, spec: MeshRunSpec, records: dict[int, Record],
              seconds: float, counts: list[WorkerCounts]) -> dict[str, Any]:
    ok = [r for r in records.values() if r.ok and r.first is not None]
    ttfts = [r.first - r.start for r in ok if r.first is not None]
    tpots = [(r.end - r.first) / (r.output_tokens - 1) for r in ok
             if r.first is not None and r.end is not None and r.output_tokens > 1]
    # What prefilling on the decode worker costs the requests decoding there.
    tpot_columns: dict[str, Any] = {
        f"tpot_p{q}_ms": 1000 * pct(tpots, q / 100) if tpots else float("nan") for q in (50, 90)}
    prefill = [c for c in counts if c.role == "prefill"]
    local = sum(c.computed for c in counts if c.role == "decode")
    computed = sum(c.computed for c in prefill) + local
    fetched = sum(c.fetched for c in prefill)
    own = sum(c.cached for c in prefill) - fetched  # fetched blocks count as cached on arrival
    # Hit columns cover the prompts prefill workers served and what local prefills
    # computed (their cached part is not told apart on a decode worker); computed tokens
    # are every worker's.
    return report.summarize(
        policy, spec.prefill, load, ttfts, computed + own + fetched, own, fetched,
        traffic.oracle_computed(spec.block_size), [c.computed for c in prefill], seconds, spec.slo_s,
        local_computed_tokens=local,
        **tpot_columns,
        kv_mib_sent=round(sum(c.kv_bytes_sent for c in prefill) / 2**20, 1),
        failed=len(traffic.jobs) - len(ok), errors=dict(Counter(r.error.partition(":")[0] for r in records.values()
                                                                 if r.error)),
        seconds=round(seconds, 1),
        pool_blocks=prefill_pool_blocks(traffic, spec))


def per_request(traffic: Traffic, records: dict[int, Record]) -> list[dict[str, Any]]:
    """Each request's timeline, for finding what a percentile is made of (misses, later
    turns, the queue)."""
    out = []
    for job in traffic.jobs:
        r = records.get(job.index)
        if r is None:
            continue
        out.append({"job": job.index, "session": job.session, "turn": job.turn, "prompt": len(job.tokens),
                    "cached": r.cached_tokens, "sent_s": round(r.start, 4), "error": r.error,
                    "ttft_ms": round(1000 * (r.first - r.start), 1) if r.first is not None else None,
                    "e2e_ms": round(1000 * (r.end - r.start), 1) if r.end is not None else None})
    return out
