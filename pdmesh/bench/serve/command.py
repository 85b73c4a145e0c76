"""``pdmesh bench serve --target T [--compare T2] [workload] [arrivals] --out DIR``.

Targets: ``grpc://HOST:PORT`` (a pdmesh router; ``grpcs://`` over TLS with ``--tls-*``),
``http://HOST:PORT`` (any OpenAI-compatible
server), ``pdmesh:P+D[/grpc]`` and ``vllm:PEER_DIR`` (started and stopped by the benchmark,
``servers.py``). With ``--compare`` the two targets run alternately, ``--rounds`` times each,
on the same prompts, and the table ends with their ratios; with several rounds, each
round's ratio and their spread (``paired.py``). A target compared with itself (the same
spec twice, the second shown as "(again)") measures the spread the machine alone gives.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdmesh.bench import BENCH_DTYPE_HELP
from pdmesh.bench.serve import cpu, report, servers
from pdmesh.bench.serve.metrics import SLO, summarize
from pdmesh.bench.serve.runner import Arrivals, run
from pdmesh.bench.serve.targets import GrpcTarget, OpenAITarget, Record, Target
from pdmesh.bench.serve.workloads import WorkloadSpec, build


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True,
                   help="grpc://H:P, grpcs://H:P (TLS), http(s)://H:P, pdmesh:P+D[/grpc] or vllm:PEER_DIR (required)")
    p.add_argument("--compare", default=None, help="a second target, run alternately (default: none)")
    p.add_argument("--model", default=None, help="model folder (needed to start pdmesh: or vllm: targets, "
                   "and the model name sent to HTTP targets; default: asked from /v1/models)")
    p.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    p.add_argument("--kvstore", action="store_true", help="started pdmesh meshes get a kvstore")
    p.add_argument("--workload", default="random", choices=["random", "prefix", "chat", "jsonl"],
                   help="what to send (default: random)")
    p.add_argument("--num-requests", type=int, default=32, help="requests (default: 32)")
    p.add_argument("--input-len", type=int, default=256, help="prompt (or suffix) tokens (default: 256)")
    p.add_argument("--output-len", type=int, default=64, help="tokens to generate (default: 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1, off)")
    p.add_argument("--prefix-len", type=int, default=512, help="prefix workload: shared prefix tokens (default: 512)")
    p.add_argument("--groups", type=int, default=4, help="prefix workload: distinct prefixes (default: 4)")
    p.add_argument("--turns", type=int, default=4, help="chat workload: turns per session (default: 4)")
    p.add_argument("--file", default="", help="jsonl workload: the file (default: none)")
    p.add_argument("--rate", type=float, nargs="+", default=[float("inf")],
                   help="request rates to sweep, req/s; inf = all at once (default: inf)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma arrivals; 1 = Poisson (default: 1)")
    p.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most; 0 = no cap (default: 0)")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds per target (default: 1)")
    p.add_argument("--ttft-slo", type=float, default=2.0, help="goodput SLO on TTFT, seconds (default: 2.0)")
    p.add_argument("--tpot-slo", type=float, default=0.2, help="goodput SLO on TPOT, seconds (default: 0.2)")
    p.add_argument("--seed", type=int, default=0, help="prompt and arrival seed (default: 0)")
    p.add_argument("--fresh-prompts", action="store_true",
                   help="draw new prompts for every run (targets that share one server must not hit "
                        "each other's prefix cache); default: the same prompts for every run")
    p.add_argument("--vocab", type=int, default=None, help="token ids are drawn below this (default: the model's)")
    p.add_argument("--api-key", default="", help="bearer token for HTTP and gRPC targets (default: none)")
    p.add_argument("--tls-ca", default="",
                   help="grpcs://H:P targets (grpc:// is plaintext): PEM CA to verify the router (default: none)")
    p.add_argument("--tls-cert", default="", help="grpcs:// targets: client certificate for mutual TLS (default: none)")
    p.add_argument("--tls-key", default="", help="grpcs:// targets: key of --tls-cert (default: none)")
    p.add_argument("--out", default="bench-results/serve", help="folder for serve.json and PNGs (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _served_model(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def _start(spec: str, args: argparse.Namespace) -> servers.Started:
    if spec.startswith(("pdmesh:", "vllm:")) and not args.model:
        raise SystemExit(f"pdmesh bench serve: {spec} needs --model DIR to start")
    if spec.startswith("pdmesh:"):
        return servers.start_pdmesh(spec.removeprefix("pdmesh:"), args.model, args.dtype, args.kvstore, [])
    if spec.startswith("vllm:"):
        return servers.start_vllm(spec.removeprefix("vllm:"), args.model, args.dtype)
    return servers.Started(spec, args.model or "", lambda: None)


def _target(started: servers.Started, args: argparse.Namespace) -> Target:
    if started.url.startswith(("grpc://", "grpcs://")):
        from pdmesh.client import Security

        scheme, _, address = started.url.partition("://")
        tls_ca, tls_cert, tls_key = (args.tls_ca, args.tls_cert, args.tls_key) if scheme == "grpcs" else ("", "", "")
        return GrpcTarget(address, Security(tls_ca, tls_cert, tls_key, api_key=args.api_key), _sampling(args))
    return OpenAITarget(started.url, started.model or _served_model(started.url), args.api_key, _sampling(args))


def _sampling(args: argparse.Namespace) -> dict[str, float]:
    """What every request asks for besides its length (the same for both targets)."""
    return {"temperature": args.temperature, "top_p": args.top_p}


async def _measure(make: Callable[[], Target], spec: WorkloadSpec, arrivals: Arrivals, progress: bool
                   ) -> tuple[list[Record], float, dict[str, dict[str, float]]]:
    """Records, seconds, and the CPU seconds each process and thread spent meanwhile."""
    target = make()  # inside the loop: clients bind to it
    try:
        await run(target, build(WorkloadSpec(num_requests=2, input_len=16, output_len=4, vocab=spec.vocab,
                                             seed=spec.seed + 99)), Arrivals(), progress=False)  # warm-up
        before = cpu.snapshot()
        recs, seconds = await run(target, build(spec), arrivals, progress)
        return recs, seconds, cpu.spent(before, cpu.snapshot())
    finally:
        await target.close()


def run_serve(args: argparse.Namespace) -> list[dict[str, Any]]:
    vocab = args.vocab
    if vocab is None and args.model:
        from pdmesh.model.config import ModelConfig

        vocab = ModelConfig.from_dir(args.model).vocab_size
    spec = WorkloadSpec(args.workload, args.num_requests, args.input_len, args.output_len, args.prefix_len,
                        args.groups, args.turns, args.file, args.seed, vocab or 1000)
    sides = [("target", args.target)] + ([("compare", args.compare)] if args.compare else [])
    rows: list[dict[str, Any]] = []
    records: dict[str, list[Record]] = {}
    runs = 0
    for rate in args.rate:
        arrivals = Arrivals(rate, args.burstiness, args.max_concurrency, args.seed)
        for rnd in range(args.rounds):
            for side, target_spec in sides:
                run_spec = replace(spec, seed=spec.seed + 1000 * runs) if args.fresh_prompts else spec
                runs += 1
                started = _start(target_spec, args)
                try:
                    recs, seconds, spent = asyncio.run(_measure(functools.partial(_target, started, args), run_spec,
                                                                arrivals, not args.no_progress))
                finally:
                    started.stop()
                row = summarize(recs, seconds, SLO(args.ttft_slo, args.tpot_slo))
                row["server_cpu_s"], row["client_cpu_s"] = cpu.totals(spent)
                name = f"{target_spec} (again)" if side == "compare" and args.compare == args.target else target_spec
                rows.append({"target": name, "side": side, "rate": rate, "round": rnd} | row | {"cpu": spent})
                records[f"{name} @ {rate:g}"] = recs
    print(f"\npdmesh bench serve — workload {args.workload}, {args.num_requests} requests, "
          f"in {args.input_len}, out {args.output_len}")
    print(report.table(rows))
    print("\nCPU seconds during each measured run (process: busiest threads):")
    for done in rows:
        print(f"{done['target']} @ {done['rate']:g}, round {done['round']}:")
        print("\n".join(cpu.lines(done["cpu"])) or "  (no /proc here)")
    if args.compare:
        for line in report.ratios(rows, args.target, args.compare):
            print(line)
    meta = {"bench": "serve", "args": {k: v for k, v in vars(args).items() if k != "func"}}
    for path in report.write(Path(args.out), meta, rows, records):
        print(f"wrote {path}")
    return rows
