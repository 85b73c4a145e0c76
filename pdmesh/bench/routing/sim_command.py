"""``pdmesh bench route-sim``: the router's policies at up to 1,000 prefill workers.

Each (workers, load, policy) runs the same traffic through ``Simulation`` against one
private redis-server; the table, JSON and plots say what each policy costs in computed
prompt tokens and TTFT, how close it gets to the oracle, and what a decision and the index
cost at that scale.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdmesh.bench import BENCH_DTYPE_HELP
from pdmesh.bench.routing import report
from pdmesh.bench.routing.traffic import (
    TrafficSpec,
    add_traffic_arguments,
    build_traffic,
    traffic_from_arguments,
)
from pdmesh.bench.stats import pct
from services.router.config import RouterConfig

if TYPE_CHECKING:
    from pdmesh.bench.routing.sim import SimResult, SimSpec

POLICIES = "round_robin,least_loaded,prefix_hash,cache_aware"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="measure prefill costs on this model's engine "
                   "(default: unset: use --us-per-token / --overhead-ms)")
    p.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    p.add_argument("--us-per-token", type=float, default=700.0,
                   help="prefill cost per prompt token without --model (default: %(default)s)")
    p.add_argument("--overhead-ms", type=float, default=5.0, help="per request without --model (default: %(default)s)")
    p.add_argument("--workers", default="32", help="prefill workers, or several: 32,1000 (default: %(default)s)")
    p.add_argument("--loads", default="0.5,0.7,0.9", help="arrival rate / capacity (default: %(default)s)")
    p.add_argument("--policies", default=POLICIES, help="(default: %(default)s)")
    p.add_argument("--requests-per-worker", type=int, default=125,
                   help="requests simulated per prefill worker (default: %(default)s)")
    p.add_argument("--groups-per-worker", type=float, default=2.0,
                   help="shared-prefix groups per prefill worker (default: %(default)s)")
    add_traffic_arguments(p, TrafficSpec(), skip=("num_requests", "groups"))
    p.add_argument("--pool-factor", type=float, default=1.5,
                   help="all pools together / the traffic's distinct blocks (default: %(default)s)")
    p.add_argument("--kvstore-blocks", type=int, default=0, help="shared kvstore tier, 0 = none (default: %(default)s)")
    p.add_argument("--preload-blocks", type=int, default=0,
                   help="blocks each worker indexes before the run, to load the index (default: %(default)s)")
    p.add_argument("--route-tolerance", type=float, default=RouterConfig.route_tolerance,
                   help="cache_aware: estimates within this fraction count as equal (default: %(default)s)")
    p.add_argument("--index", choices=("mirror", "redis"), default="mirror",
                   help="where decisions read the prefix index: the router's mirror or Redis (default: %(default)s)")
    p.add_argument("--slo-ms", type=float, default=2000.0, help="TTFT objective for goodput (default: %(default)s)")
    p.add_argument("--out", default="bench-results/route-sim.json",
                   help="JSON report; PNGs beside it (default: %(default)s)")


def run_route_sim(args: argparse.Namespace) -> None:
    # Imported here: the CLI builds this parser without loading torch, Redis or the router.
    from pdmesh.bench.routing.costs import PrefillCosts, measure
    from pdmesh.bench.routing.sim import SimSpec, simulate
    from pdmesh.launcher import Mesh, MeshSpec

    costs = (measure(args.model, args.dtype) if args.model else
             PrefillCosts(args.overhead_ms / 1000, args.us_per_token * 1e-6, "given on the command line"))
    print(f"prefill costs: {1000 * costs.overhead_s:.2f} ms + {1e6 * costs.s_per_token:.1f} us/token ({costs.source})")
    redis = Mesh(MeshSpec(model=args.model or "sim"))
    redis.start_redis()
    rows, cdfs = [], {}
    try:
        for workers in [int(w) for w in args.workers.split(",")]:
            traffic = build_traffic(traffic_from_arguments(
                args, TrafficSpec(), num_requests=args.requests_per_worker * workers,
                groups=max(1, int(args.groups_per_worker * workers))))
            for load in [float(x) for x in args.loads.split(",")]:
                for policy in args.policies.split(","):
                    spec = SimSpec(prefill_workers=workers, s_per_token=costs.s_per_token,
                                   overhead_s=costs.overhead_s, load=load, pool_factor=args.pool_factor,
                                   kvstore_blocks=args.kvstore_blocks, preload_blocks=args.preload_blocks,
                                   slo_s=args.slo_ms / 1000, route_tolerance=args.route_tolerance,
                                   index=args.index)
                    result = simulate(policy, traffic, spec, redis.redis_url)
                    row = _row(result, spec)
                    rows.append(row)
                    cdfs[f"{policy} {workers}w {load:.1f}"] = [s.done - s.arrival for s in result.served]
                    print(report.table([row]).splitlines()[-1], flush=True)
    finally:
        redis.stop_redis()
    print()
    print(report.table(rows))
    extra_cols = ["index", "lookup_p50_ms", "lookup_p99_ms", "lookup_members_p50", "lookup_members_p99",
                  "mirror_share", "redis_ops_per_s", "redis_memory_mb", "indexed_blocks", "reasons"]
    for r in rows:
        print(f"{r['policy']:<13} {r['workers']:>5} workers load {r['load']:.1f}: " +
              ", ".join(f"{k} {r[k]}" for k in extra_cols))
    for line in report.versus(rows):
        print(line)
    out = Path(args.out)
    written = report.write(rows, out, {"costs": costs.__dict__}, cdfs)
    print(f"wrote {out}, " + ", ".join(map(str, written)))


def _row(r: SimResult, spec: SimSpec) -> dict[str, Any]:
    prompt = sum(len(s.job.tokens) for s in r.served)
    per_worker = [0] * r.workers
    lookups = [s.lookup_s for s in r.served]
    for s in r.served:
        per_worker[s.worker] += len(s.job.tokens) - s.cached - s.fetched
    return report.summarize(
        r.policy, r.workers, r.load, [s.done - s.arrival for s in r.served], prompt,
        sum(s.cached for s in r.served), sum(s.fetched for s in r.served), r.oracle_computed,
        per_worker, r.duration_s, spec.slo_s, [s.decision_s for s in r.served],
        lookup_p50_ms=round(1000 * pct(lookups, 0.5), 2), lookup_p99_ms=round(1000 * pct(lookups, 0.99), 2),
        lookup_members_p50=pct([s.members for s in r.served], 0.5),
        lookup_members_p99=pct([s.members for s in r.served], 0.99),
        redis_ops_per_s=round(r.redis_ops_per_s), redis_memory_mb=round(r.redis_memory_mb, 1),
        indexed_blocks=r.indexed_blocks, reasons=dict(r.decisions), wall_s=round(r.wall_s, 1),
        pool_blocks=r.pool_blocks, index=spec.index, mirror_share=round(r.mirror_s / r.wall_s, 3))
