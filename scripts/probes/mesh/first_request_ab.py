"""A fresh mesh's first request against its later ones, for one or more source trees.

Each run starts 1 prefill + 1 decode worker and the router as ``pdmesh up`` does and
sends lone two-token prompts through the router one at a time. The first token leaves
the prefill worker before the prompt's KV is written; the second comes from the decode
worker once the KV has landed, so it carries the write. The first request pays for what
the mesh sets up on first use (the NIXL connection between the two workers, whose UCX
handshake needs the decode worker's progress passes), the later ones do not. The run
also reads how the decode worker was told each prompt's KV landed (within its writer's
call, or found by polling). Trees are run in turn, each mesh from a fresh process in that
tree, ``--rounds`` times:

    .venv/bin/python scripts/probes/mesh/first_request_ab.py --model .cache/models/small-llama \\
        --tree /tmp/wt_old --tree . [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


async def _timings(address: str, prompts: list[list[int]], gap_s: float) -> list[tuple[float, float]]:
    """Each prompt's (first token, second token) seconds: the first token leaves the prefill
    worker before its KV is written, the second comes from the decode worker after."""
    from pdmesh.client import AsyncClient

    out = []
    async with AsyncClient(address, timeout=120) as client:
        for prompt in prompts:
            t0 = time.perf_counter()
            seen: list[float] = []
            # Two tokens: a request that ends at its first token needs no KV written.
            async for resp in client.generate(prompt, max_tokens=2, temperature=0, ignore_eos=True):
                seen += [time.perf_counter() - t0] * len(resp.token_ids)
            assert len(seen) == 2, f"the router streamed {len(seen)} tokens, not 2"
            out.append((seen[0], seen[1]))
            await asyncio.sleep(gap_s)
    return out


def child(args: argparse.Namespace) -> None:
    from pdmesh.engine.async_engine import LEND_AFTER_IDLE_S
    from pdmesh.launcher import Mesh, MeshSpec
    from pdmesh.telemetry.scrape import scrape, total

    rng = random.Random(args.seed)
    prompts = [[rng.randrange(10, 1000) for _ in range(args.input_len)] for _ in range(args.n)]
    with tempfile.TemporaryDirectory() as logs, Mesh(MeshSpec(model=args.model, prefill=1, decode=1,
                                                              log_dir=logs)) as mesh:
        timings = asyncio.run(_timings(mesh.router_address, prompts, 2.5 * LEND_AFTER_IDLE_S))
        samples = scrape(mesh.decode[0].metrics_address)
        paths = {p: total(samples, "pdmesh_kv_writes_received_total", path=p) for p in ("inline", "polled")}
    print(json.dumps({"ttft_ms": [1e3 * a for a, _ in timings], "second_ms": [1e3 * b for _, b in timings],
                      "paths": paths}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tree", action="append", required=True, help="a source tree (repeat to compare)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=5, help="lone prompts per mesh (the first is the one timed apart)")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results: dict[str, list[dict]] = {t: [] for t in args.tree}
    for rnd in range(args.rounds):
        for tree in args.tree:
            root = str(Path(tree).resolve())
            # The tree as the working directory too: the mesh starts its processes with
            # ``python -m``, which puts the working directory ahead of PYTHONPATH.
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", str(Path(args.model).resolve()),
                   "--tree", tree, "--n", str(args.n), "--input-len", str(args.input_len),
                   "--seed", str(args.seed + rnd)]
            done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=root), cwd=root, capture_output=True,
                                  text=True, timeout=600, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results[tree].append(row)
            print(f"round {rnd} {tree}: first request {row['ttft_ms'][0]:.1f} / {row['second_ms'][0]:.1f} ms, "
                  f"later ones' p50 {statistics.median(row['ttft_ms'][1:]):.1f} / "
                  f"{statistics.median(row['second_ms'][1:]):.1f} ms (first / second token); "
                  f"decode told {row['paths']}", flush=True)
    print("\ntree: the first request's second token, ms per round | later requests' p50 per round")
    for tree, rows in results.items():
        firsts = " ".join(f"{r['second_ms'][0]:.1f}" for r in rows)
        laters = " ".join(f"{statistics.median(r['second_ms'][1:]):.1f}" for r in rows)
        print(f"{tree}: {firsts} | {laters}")


if __name__ == "__main__":
    main()
