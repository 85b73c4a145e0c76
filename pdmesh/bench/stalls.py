"""``pdmesh bench stalls``: a worker that hangs instead of dying (SIGSTOP), on a real mesh:
how many streams complete, with the no-fault tokens, the largest gap a stream saw, the
TTFT of requests sent during the hang, and whether every block was freed after it.
The scenarios are in ``stall_runs.py``; docs/reliability.md keeps the figures."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from pdmesh.bench import BENCH_DTYPE_HELP, stall_runs

CASES = {"decode": stall_runs.decode_stopped, "engine": stall_runs.engine_stuck, "prefill": stall_runs.prefill_stopped,
         "flap": stall_runs.flapping}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder (required)")
    p.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    p.add_argument("--cases", default=",".join(CASES), help="scenarios to run (default: %(default)s)")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="an extra flag for every worker, e.g. --worker-arg=--num-blocks=512 "
                        "(repeatable; default: none)")
    p.add_argument("--log-dir", default="bench-results/stalls-logs", help="the meshes' logs (default: %(default)s)")
    p.add_argument("--out", default="bench-results/stalls.json", help="JSON report (default: %(default)s)")


def run_stalls(args: argparse.Namespace) -> list[dict]:
    rows = []
    for name in args.cases.split(","):
        log_dir = Path(args.log_dir) / name
        log_dir.mkdir(parents=True, exist_ok=True)
        result = CASES[name](args.model, ["--dtype", args.dtype, *args.worker_arg], str(log_dir))
        rows.append(result.summary())
        print(_row(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2, default=str))
    print(f"wrote {args.out}")
    return rows


def _row(r: dict) -> str:
    def s(v: float) -> str:
        return "-" if isinstance(v, float) and math.isnan(v) else f"{v:.2f}"

    return (f"{r['case']:<28} in flight {r['in_flight_completed']:>6} (exact {r['in_flight_exact']}), largest gap "
            f"p50/p99 {s(r['largest_gap_p50_s'])}/{s(r['largest_gap_p99_s'])} s; new {r['new_completed']}, TTFT "
            f"p50/p99 {s(r['new_ttft_p50_s'])}/{s(r['new_ttft_p99_s'])} s; failures {r['failures'] or 'none'}; "
            f"blocks held after {r['blocks_held_after']}"
            + "".join(f"; {k} {v}" for k, v in r.items() if k in ("stopped_streams", "new_exact", "share_before",
                                                                     "share_flapping")))
