"""``pdmesh bench route-mesh``: its options, the capacity run, the (load, policy) runs and
the report. How one run is measured is in ``mesh_run.py``."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from itertools import product
from pathlib import Path
from typing import Any

from pdmesh.bench import BENCH_DTYPE_HELP
from pdmesh.bench.routing import report
from pdmesh.bench.routing.mesh_run import (
    POLICIES,
    MeshRunSpec,
    per_request,
    prefill_pool_blocks,
    run_policy,
    summarize,
)
from pdmesh.bench.routing.traffic import (
    TrafficSpec,
    add_traffic_arguments,
    build_traffic,
    traffic_from_arguments,
)

TRAFFIC = TrafficSpec(num_requests=480, groups=12, prefix_len=512, suffix_len=64, chat_share=0.3, turns=3,
                      turn_len=48, output_len=16)
"""Scaled to 2 prefill + 1 decode workers on 2 cores: about 50 s of arrivals per run at 70%
load, so that the tail measures the steady state. At 160 requests (15 s) the requests
around cache_aware's TTFT p90 were mostly the cold start (docs/routing.md, "Not done yet"),
the same for any policy, and the ratio to round robin ranged 1.61-3.46x by seed."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder (required)")
    p.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    p.add_argument("--policies", default=POLICIES, help="prefill policies to compare (default: %(default)s)")
    p.add_argument("--loads", default="0.5,0.7,0.9", help="arrival rate / measured capacity (default: %(default)s)")
    p.add_argument("--capacity", type=float, default=0.0,
                   help="requests/s the mesh sustains; 0 = measure it first (default: 0)")
    p.add_argument("--capacity-policy", default="cache_aware", help="policy of that measurement (default: %(default)s)")
    p.add_argument("--prefill", type=int, default=2, help="prefill workers (default: %(default)s)")
    p.add_argument("--decode", type=int, default=1, help="decode workers (default: %(default)s)")
    p.add_argument("--decode-policies", default="holder",
                   help="decode policies to compare, e.g. holder,least_loaded with --decode 2 (default: %(default)s)")
    p.add_argument("--kvstore", action="store_true", help="add the shared kvstore tier")
    add_traffic_arguments(p, TRAFFIC)  # --prefix-len 0: uniform random prompts
    p.add_argument("--pool-factor", type=float, default=MeshRunSpec.pool_factor,
                   help="prefill pools together / shared-prefix blocks (default: %(default)s)")
    p.add_argument("--inflight-prompts", type=int, default=MeshRunSpec.inflight_prompts,
                   help="longest prompts' worth of blocks each prefill pool gets beyond its share of the "
                        "prefixes (default: %(default)s)")
    p.add_argument("--prefill-arg", action="append", default=[],
                   help="an extra flag for the prefill workers, e.g. --prefill-arg=--max-num-batched-tokens=512 "
                        "(repeatable; default: none)")
    p.add_argument("--router-arg", action="append", default=[],
                   help="an extra flag for the router, applied under every policy, e.g. "
                        "--router-arg=--local-prefill-tokens=128 (repeatable; default: none)")
    p.add_argument("--think-s", type=float, default=MeshRunSpec.think_s, help="(default: %(default)s)")
    p.add_argument("--slo-ms", type=float, default=2000.0, help="TTFT objective for goodput (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=1,
                   help="repeat every (load, policy) on this many traffic seeds (seed, seed + 1, ...); the "
                        "capacity is measured once, on the first (default: %(default)s)")
    p.add_argument("--log-dir", default="", help="keep the meshes' logs here (default: temporary)")
    p.add_argument("--out", default="bench-results/route-mesh.json", help="JSON; PNGs beside it (default: %(default)s)")


def run_route_mesh(args: argparse.Namespace) -> None:
    from pdmesh.model.config import ModelConfig

    vocab = min(8192, ModelConfig.from_dir(args.model).vocab_size)
    traffic = build_traffic(replace(traffic_from_arguments(args, TRAFFIC), groups=max(1, args.groups), vocab=vocab))
    spec = MeshRunSpec(args.model, args.dtype, args.prefill, args.decode, kvstore=args.kvstore,
                       pool_factor=args.pool_factor,
                       inflight_prompts=args.inflight_prompts, prefill_args=tuple(args.prefill_arg),
                       router_args=tuple(args.router_arg),
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
    decode_policies = args.decode_policies.split(",")
    for k in range(args.seeds):
        # Another seed: other prefixes, conversations and arrival times of the same shape.
        run_traffic = traffic if k == 0 else build_traffic(replace(traffic.spec, seed=args.seed + k))
        starts_share = len(run_traffic.starts) / len(run_traffic.jobs)
        runs = product([float(x) for x in args.loads.split(",")], args.policies.split(","), decode_policies)
        for load, policy, decode_policy in runs:
            label = policy if len(decode_policies) == 1 else f"{policy}+{decode_policy}"
            key = f"{label} {load:.1f}" + (f" seed {args.seed + k}" if args.seeds > 1 else "")
            records, seconds, counts, reasons = run_policy(
                run_traffic, replace(spec, seed=args.seed + k), policy, load * capacity * starts_share,
                _sub(args.log_dir, key.replace(" ", "-")), decode_policy)
            row = summarize(label, load, run_traffic, spec, records, seconds, counts) | {
                "decode_policy": decode_policy, "rate_rps": load * capacity, "reasons": reasons}
            if args.seeds > 1:
                row["seed"] = args.seed + k
            rows.append(row)
            requests[key] = per_request(run_traffic, records)
            cdfs[key] = sorted(r.first - r.start for r in records.values() if r.ok and r.first is not None)
            print(report.table([row]).splitlines()[-1] + f"   TPOT p50 / p90 {row['tpot_p50_ms']:.1f} / "
                  f"{row['tpot_p90_ms']:.1f} ms, KV {row['kv_mib_sent']} MiB, failed {row['failed']} {reasons}",
                  flush=True)
    measured = [r for r in rows if not r.get("capacity_run")]
    print()
    print(report.table(rows))
    for line in report.versus(measured):
        print(line)
    if args.seeds > 1:
        for line in _over_seeds(measured):
            print(line)
    for r in measured:
        print(f"{r['policy']} load {r['load']:.1f}: KV written to decode workers {r['kv_mib_sent']} MiB")
    out = Path(args.out)
    meta = {"bench": "route-mesh", "capacity_rps": capacity, "traffic": traffic.spec.__dict__,
            "spec": spec.__dict__, "oracle_computed": traffic.oracle_computed(bs), "requests": requests}
    written = report.write(rows, out, meta, cdfs)
    print(f"wrote {out}, " + ", ".join(map(str, written)))


def _over_seeds(rows: list[dict[str, Any]]) -> list[str]:
    """Per (load, policy): TTFT p90 and computed / oracle of every seed, and their medians."""
    out = []
    for key in dict.fromkeys((r["load"], r["policy"]) for r in rows):
        mine = [r for r in rows if (r["load"], r["policy"]) == key]
        p90 = [round(r["ttft_p90_ms"]) for r in mine]
        ratio = [round(r["computed_vs_oracle"], 2) for r in mine]
        out.append(f"load {key[0]:.1f} {key[1]}: TTFT p90 ms {p90} (median {statistics.median(p90):.0f}), "
                   f"computed / oracle {ratio} (median {statistics.median(ratio):.2f})")
    return out


def _sub(log_dir: str, name: str) -> str:
    return str(Path(log_dir) / name) if log_dir else ""
