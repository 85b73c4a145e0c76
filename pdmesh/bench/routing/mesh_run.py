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

import argparse
import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pdmesh.bench.routing import report
from pdmesh.bench.routing.traffic import Job, Traffic, TrafficSpec, build_traffic
from pdmesh.bench.serve.targets import GrpcTarget, Record

POLICIES = "round_robin,least_loaded,cache_aware"


@dataclass(frozen=True)
class MeshRunSpec:
    model: str
    dtype: str = "float32"
    prefill: int = 2
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


@dataclass
class WorkerCounts:
    computed: int
    cached: int
    fetched: int

    def minus(self, other: WorkerCounts) -> WorkerCounts:
        return WorkerCounts(self.computed - other.computed, self.cached - other.cached,
                            self.fetched - other.fetched)


def prefill_pool_blocks(traffic: Traffic, spec: MeshRunSpec) -> int:
    """Each prefill worker's pool: its share of ``pool_factor`` x the shared prefixes' blocks,
    plus room for ``inflight_prompts`` of the longest prompt."""
    prefix_blocks = traffic.spec.groups * (traffic.spec.prefix_len // spec.block_size)
    longest = max(len(j.tokens) for j in traffic.jobs) // spec.block_size + 1
    return int(spec.pool_factor * prefix_blocks / spec.prefill) + spec.inflight_prompts * longest


def _decisions(metrics_address: str) -> dict[str, int]:
    """The router's routing decisions by reason (``pdmesh_routing_decisions``), e.g.
    ``{"cache_aware/balance": 12}``: why each request went where it went."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {f"{s.labels['policy']}/{s.labels['reason']}": int(s.value)
            for fam in text_string_to_metric_families(text) if fam.name == "pdmesh_routing_decisions"
            for s in fam.samples if s.name.endswith("_total")}


def decode_pool_blocks(traffic: Traffic, spec: MeshRunSpec) -> int:
    """Room on the decode worker for every start at once (the capacity run sends them so):
    a decode worker without room refuses a request (RESOURCE_EXHAUSTED), and routing is
    what this compares."""
    longest = max(len(j.tokens) + j.output_len for j in traffic.jobs) // spec.block_size + 1
    return max(2048, len(traffic.starts) * longest)


async def _counts(addresses: list[str]) -> list[WorkerCounts]:
    from pdmesh.rpc.clients import fetch_info

    infos = [await fetch_info(a, timeout=10) for a in addresses]
    return [WorkerCounts(i.computed_prompt_tokens, i.cached_prompt_tokens, i.kvstore_fetched_tokens) for i in infos]


async def drive(address: str, traffic: Traffic, rate: float, think_s: float, seed: int
                ) -> tuple[dict[int, Record], float]:
    """Send every job: first turns and independent requests at Poisson ``rate`` of starts
    (inf: all at once), each conversation's next turn ``think_s`` (mean, exponential) after
    its previous answer. Returns each job's record and the wall time of the whole run."""
    rng = random.Random(seed)
    target = GrpcTarget(address)
    records: dict[int, Record] = {}
    pending: set[asyncio.Task[None]] = set()

    async def one(job: Job) -> None:
        rec = records[job.index] = Record(time.perf_counter(), prompt_tokens=len(job.tokens))
        await target.send(job.tokens, job.output_len, rec)
        if job.next_turn is not None:
            pause = rng.expovariate(1 / think_s) if think_s > 0 else 0.0
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


def run_policy(traffic: Traffic, spec: MeshRunSpec, policy: str, starts_rate: float, log_dir: str = ""
               ) -> tuple[dict[int, Record], float, list[WorkerCounts], dict[str, int]]:
    """One fresh mesh, one policy: the records, the run's seconds, what each prefill
    worker computed / found cached / fetched during it, and the router's decisions."""
    from pdmesh.launcher import Mesh, MeshSpec

    pool = prefill_pool_blocks(traffic, spec)
    worker = ["--dtype", spec.dtype, "--block-size", str(spec.block_size)]
    mesh_spec = MeshSpec(model=spec.model, prefill=spec.prefill, decode=1, kvstore=int(spec.kvstore),
                         worker_args=worker, prefill_args=["--num-blocks", str(pool)],
                         decode_args=["--num-blocks", str(decode_pool_blocks(traffic, spec))],
                         router_args=["--prefill-policy", policy, "--info-interval-s", "0.2"],
                         log_dir=log_dir, share_cores=False)
    # Fixed core shares: a worker lending its share measures cheaper and draws the work
    # (tests/integration/mesh/conftest.py); this compares routing, not lending.
    with Mesh(mesh_spec) as mesh:
        addresses = [p.address for p in mesh.prefill]
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
    computed = sum(c.computed for c in counts)
    fetched = sum(c.fetched for c in counts)
    own = sum(c.cached for c in counts) - fetched  # fetched blocks count as cached on arrival
    return report.summarize(
        policy, spec.prefill, load, [r.first - r.start for r in ok], computed + own + fetched, own, fetched,
        traffic.oracle_computed(spec.block_size), [c.computed for c in counts], seconds, spec.slo_s,
        failed=len(traffic.jobs) - len(ok), errors=dict(Counter(r.error.partition(":")[0] for r in records.values()
                                                                 if r.error)),
        seconds=round(seconds, 1),
        pool_blocks=prefill_pool_blocks(traffic, spec))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder (required)")
    p.add_argument("--dtype", default="float32", help="(default: %(default)s)")
    p.add_argument("--policies", default=POLICIES, help="prefill policies to compare (default: %(default)s)")
    p.add_argument("--loads", default="0.5,0.7,0.9", help="arrival rate / measured capacity (default: %(default)s)")
    p.add_argument("--capacity", type=float, default=0.0,
                   help="requests/s the mesh sustains; 0 = measure it first (default: 0)")
    p.add_argument("--capacity-policy", default="cache_aware", help="policy of that measurement (default: %(default)s)")
    p.add_argument("--prefill", type=int, default=2, help="prefill workers (default: %(default)s)")
    p.add_argument("--kvstore", action="store_true", help="add the shared kvstore tier")
    p.add_argument("--num-requests", type=int, default=160, help="(default: %(default)s)")
    p.add_argument("--groups", type=int, default=12, help="shared prefixes (default: %(default)s)")
    p.add_argument("--prefix-len", type=int, default=512, help="(default: %(default)s; 0 = uniform random prompts)")
    p.add_argument("--suffix-len", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--chat-share", type=float, default=0.3, help="(default: %(default)s)")
    p.add_argument("--turns", type=int, default=3, help="(default: %(default)s)")
    p.add_argument("--turn-len", type=int, default=48, help="(default: %(default)s)")
    p.add_argument("--output-len", type=int, default=16, help="(default: %(default)s)")
    p.add_argument("--zipf", type=float, default=1.1, help="prefix popularity (default: %(default)s)")
    p.add_argument("--pool-factor", type=float, default=MeshRunSpec.pool_factor,
                   help="prefill pools together / shared-prefix blocks (default: %(default)s)")
    p.add_argument("--inflight-prompts", type=int, default=MeshRunSpec.inflight_prompts,
                   help="longest prompts' worth of blocks each prefill pool gets beyond its share of the "
                        "prefixes (default: %(default)s)")
    p.add_argument("--think-s", type=float, default=MeshRunSpec.think_s, help="(default: %(default)s)")
    p.add_argument("--slo-ms", type=float, default=2000.0, help="TTFT objective for goodput (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    p.add_argument("--log-dir", default="", help="keep the meshes' logs here (default: temporary)")
    p.add_argument("--out", default="bench-results/route-mesh.json", help="JSON; PNGs beside it (default: %(default)s)")


def run_route_mesh(args: argparse.Namespace) -> None:
    from pdmesh.model.config import ModelConfig

    vocab = min(8192, ModelConfig.from_dir(args.model).vocab_size)
    traffic = build_traffic(TrafficSpec(
        num_requests=args.num_requests, groups=max(1, args.groups), prefix_len=args.prefix_len,
        zipf=args.zipf, suffix_len=args.suffix_len, chat_share=args.chat_share, turns=args.turns,
        turn_len=args.turn_len, output_len=args.output_len, seed=args.seed, vocab=vocab))
    spec = MeshRunSpec(args.model, args.dtype, args.prefill, kvstore=args.kvstore, pool_factor=args.pool_factor,
                       inflight_prompts=args.inflight_prompts,
                       think_s=args.think_s, slo_s=args.slo_ms / 1000, seed=args.seed)
    bs = spec.block_size
    print(f"traffic: {len(traffic.jobs)} requests ({len(traffic.starts)} starts), {traffic.prompt_tokens} prompt "
          f"tokens, oracle computes {traffic.oracle_computed(bs)}; {traffic.spec.groups} prefixes of "
          f"{traffic.spec.prefix_len} tokens = {traffic.spec.groups * (traffic.spec.prefix_len // bs)} blocks; "
          f"prefill pools {prefill_pool_blocks(traffic, spec)} blocks each", flush=True)
    capacity = args.capacity
    rows: list[dict[str, Any]] = []
    cdfs: dict[str, list[float]] = {}
    requests: dict[str, list[dict[str, Any]]] = {}
    if not capacity:
        records, seconds, counts, reasons = run_policy(traffic, replace(spec, think_s=0.0), args.capacity_policy,
                                                       float("inf"), _sub(args.log_dir, "capacity"))
        failed = [r.error for r in records.values() if r.error]
        if failed:
            raise SystemExit(f"capacity run: {len(failed)} requests failed ({failed[0]}); its rate would mean nothing")
        capacity = len(traffic.jobs) / seconds
        rows.append(summarize(args.capacity_policy, float("inf"), traffic, spec, records, seconds, counts)
                    | {"capacity_run": True, "reasons": reasons})
        print(f"capacity ({args.capacity_policy}, everything at once): {len(traffic.jobs)} requests in "
              f"{seconds:.1f} s = {capacity:.2f} req/s", flush=True)
    starts_share = len(traffic.starts) / len(traffic.jobs)
    for load in [float(x) for x in args.loads.split(",")]:
        for policy in args.policies.split(","):
            records, seconds, counts, reasons = run_policy(traffic, spec, policy, load * capacity * starts_share,
                                                           _sub(args.log_dir, f"{policy}-{load}"))
            row = summarize(policy, load, traffic, spec, records, seconds, counts) | {
                "rate_rps": load * capacity, "reasons": reasons}
            rows.append(row)
            requests[f"{policy} {load:.1f}"] = _per_request(traffic, records)
            cdfs[f"{policy} {load:.1f}"] = sorted(r.first - r.start for r in records.values()
                                                  if r.ok and r.first is not None)
            print(report.table([row]).splitlines()[-1] + f"   failed {row['failed']} {reasons}", flush=True)
    measured = [r for r in rows if not r.get("capacity_run")]
    print()
    print(report.table(rows))
    for line in report.versus(measured):
        print(line)
    out = Path(args.out)
    meta = {"bench": "route-mesh", "capacity_rps": capacity, "traffic": traffic.spec.__dict__,
            "spec": spec.__dict__, "oracle_computed": traffic.oracle_computed(bs), "requests": requests}
    written = report.write(rows, out, meta, cdfs)
    print(f"wrote {out}, " + ", ".join(map(str, written)))


def _per_request(traffic: Traffic, records: dict[int, Record]) -> list[dict[str, Any]]:
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


def _sub(log_dir: str, name: str) -> str:
    return str(Path(log_dir) / name) if log_dir else ""
