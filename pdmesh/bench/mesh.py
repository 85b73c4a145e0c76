"""``pdmesh bench mesh``: the mesh against the in-process engine, routing policies, transfer, index.

All in one run on this machine, so ratios are what to read:
1. the same workload through the mesh (1 prefill + 1 decode, as ``pdmesh up`` starts them)
   and in process: output throughput ratio and the TTFT the mesh adds (p50 / p90); and a
   lone request's TTFT through the mesh against one worker and in process, alternated
   (``lone.py``);
2. ``cache_aware`` vs ``round_robin`` with 2 prefill workers on shared-prefix traffic
   (groups x prompts with a long shared prefix; prefill pools sized so that one worker can
   hold half the prefixes): prefix-cache hit rate and TTFT p90;
3. KV transfer throughput inside a mesh that disaggregates every request (bytes / seconds
   of writes, under that workload) vs raw NIXL between two processes for blocks of the
   same size;
4. router decisions per second and Redis index lookup latency with 1M blocks indexed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from pdmesh.bench.lone import bench_lone
from pdmesh.bench.mesh_index import bench_index
from pdmesh.bench.raw_nixl import raw_nixl_gib_s
from pdmesh.bench.report_row import Row
from pdmesh.bench.stats import pct
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.mesh_types import WorkerInfo


def _mesh_workload(address: str, prompts: list[list[int]], max_tokens: int, concurrency: int
                   ) -> dict[str, float]:
    from pdmesh.client import Client

    ttfts: list[float] = []
    tokens = [0]
    cached = [0]
    lock = threading.Lock()
    local = threading.local()
    clients: list[Client] = []

    def client() -> Client:
        # One channel per client thread, kept, as a real caller keeps it: a channel per
        # request would time TCP and HTTP/2 set-up, which is not the mesh's.
        if not hasattr(local, "client"):
            local.client = Client(address)
            with lock:
                clients.append(local.client)
        return local.client

    def one(p: list[int]) -> None:
        c = client()
        t0 = time.monotonic()
        first = None
        n = 0
        for resp in c.generate(p, max_tokens=max_tokens, temperature=0, ignore_eos=True):
            if first is None and resp.token_ids:
                first = time.monotonic() - t0
            n += len(resp.token_ids)
            if resp.finish_reason:
                with lock:
                    cached[0] += resp.usage.cached_tokens
        with lock:
            ttfts.append(first or 0.0)
            tokens[0] += n

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, prompts))
    finally:
        for c in clients:
            c.close()
    seconds = time.monotonic() - start
    return {"tok_s": tokens[0] / seconds, "ttft_p50": pct(ttfts, 0.5), "ttft_p90": pct(ttfts, 0.9),
            "hit_rate": cached[0] / sum(len(p) for p in prompts)}


def _in_process(model: str, dtype: str, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    import torch

    from pdmesh.bench.engine import _run_engine
    from pdmesh.engine.llm_engine import LLMEngine

    saved = torch.get_num_threads()
    engine = LLMEngine.from_model(model, dtype=dtype)
    try:
        _run_engine(engine, prompts[:2], 2)  # warm-up
        engine.pool.reset_prefix_cache()
        res = _run_engine(engine, prompts, max_tokens)
        return {"tok_s": res["output_tokens"] / res["seconds"], "ttft_p50": res["ttft_p50"],
                "ttft_p90": res["ttft_p90"]}
    finally:
        torch.set_num_threads(saved)


def _worker_args(args: argparse.Namespace, num_blocks: int) -> list[str]:
    threads = ["--threads", str(args.threads)] if args.threads else []
    return ["--dtype", args.dtype, "--num-blocks", str(num_blocks), *threads]


def _prefill_infos(mesh: Mesh) -> list[WorkerInfo]:
    from pdmesh.rpc.clients import fetch_info

    async def fetch() -> list[WorkerInfo]:
        return [await fetch_info(p.address, timeout=5) for p in mesh.prefill]

    return asyncio.run(fetch())


SECTIONS = ("engine", "kv", "routing", "index")
"""``--sections``: the mesh vs in-process, KV writes vs raw NIXL, routing policies, index."""


def _burst(args: argparse.Namespace, rng: random.Random) -> tuple[list[list[int]], int]:
    """The prompts sent all at once, and the tokens each asks for (sections engine and kv)."""
    n, plen, out = (8, 64, 8) if args.quick else (32, 256, 32)
    return [[rng.randrange(10, 1000) for _ in range(plen)] for _ in range(n)], out


def bench_vs_engine(args: argparse.Namespace, rows: list[Row], prompts: list[list[int]], out: int) -> None:
    n, plen = len(prompts), len(prompts[0])
    local = _in_process(args.model, args.dtype, prompts, out)
    spec = MeshSpec(model=args.model, prefill=1, decode=1, worker_args=_worker_args(args, 2048))
    spec.router_args += spec.colocated_router_args()  # as `pdmesh up` starts it
    with Mesh(spec) as mesh:
        _mesh_workload(mesh.router_address, prompts[:2], 2, 2)  # warm-up
        remote = _mesh_workload(mesh.router_address, prompts, out, n)
    label = f"{n} x {plen} in + {out} out, all at once"
    rows.append(Row("mesh vs in-process", f"output tok/s ({label})", remote["tok_s"], local["tok_s"]))
    rows.append(Row("mesh vs in-process", "TTFT p50 added (ms)", 1000 * (remote["ttft_p50"] - local["ttft_p50"])))
    rows.append(Row("mesh vs in-process", "TTFT p90 added (ms)", 1000 * (remote["ttft_p90"] - local["ttft_p90"])))
    bench_lone(args, rows, _worker_args(args, 2048), plen)


def bench_kv_transfer(args: argparse.Namespace, rows: list[Row], prompts: list[list[int]], out: int) -> None:
    """KV writes under load, every request disaggregated (conditional disaggregation off,
    or the busy rule would keep most of a burst off the prefill worker). Counted after a
    warm-up request, so that connecting the two NIXL agents is not in the figure (nor is
    it in raw NIXL's); seconds are those with a write in flight, overlapping writes once."""
    spec = MeshSpec(model=args.model, prefill=1, decode=1, worker_args=_worker_args(args, 2048),
                    router_args=["--prefill-busy-requests", "0"])
    with Mesh(spec) as mesh:
        _mesh_workload(mesh.router_address, prompts[:1], 1, 1)
        before = _prefill_infos(mesh)
        _mesh_workload(mesh.router_address, prompts, out, len(prompts))
        infos = _prefill_infos(mesh)
    sent = sum(i.kv_bytes_sent for i in infos) - sum(i.kv_bytes_sent for i in before)
    secs = sum(i.kv_transfer_seconds for i in infos) - sum(i.kv_transfer_seconds for i in before)
    per_request = -(-len(prompts[0]) // infos[0].block_size)
    raw = raw_nixl_gib_s(infos[0].kv_block_bytes, per_request)
    fresh = raw_nixl_gib_s(infos[0].kv_block_bytes, per_request, fresh=True)
    mesh_gib_s = sent / max(secs, 1e-9) / 2**30
    note = f"{sent / 2**20:.1f} MiB in {secs:.3f} s"
    rows.append(Row("kv transfer", f"mesh KV write GiB/s (writes of ~{per_request} blocks, under load)",
                    mesh_gib_s, raw, note=note))
    rows.append(Row("kv transfer", "mesh KV write GiB/s vs raw NIXL into fresh blocks", mesh_gib_s, fresh,
                    note="a mesh writes each request into blocks not written just before"))
    rows.append(Row("kv transfer", f"raw NIXL GiB/s ({per_request}-block writes, 2 processes)", raw))
    rows.append(Row("kv transfer", f"raw NIXL GiB/s ({per_request}-block writes, fresh blocks each)", fresh))
    _copy_floor_rows(rows, infos[0].kv_block_bytes, per_request, mesh_gib_s)


def _copy_floor_rows(rows: list[Row], block_bytes: int, blocks: int, mesh_gib_s: float) -> None:
    """The same blocks copied by one core in its own memory (``copy_rates.py``), which says
    what the copy under a mesh's write can reach: UCX's ``cma`` copies with plain stores,
    which read each destination line before writing it unless it is in cache. A host that
    cannot build the copies says why instead of giving figures."""
    from pdmesh.bench.copy_rates import CopyRatesUnavailableError, copy_gib_s

    try:
        both_cached = copy_gib_s(block_bytes, blocks)
        src_cached = copy_gib_s(block_bytes, blocks, fresh_dst=True)
        plain = copy_gib_s(block_bytes, blocks, fresh_src=True, fresh_dst=True)
        streamed = copy_gib_s(block_bytes, blocks, streamed=True, fresh_src=True, fresh_dst=True)
    except CopyRatesUnavailableError as e:
        print(f"kv transfer: one-core copies not measured: {e}")
        return
    section = "kv transfer: a copy, no NIXL"
    rows.append(Row(section, "mesh KV write GiB/s vs plain stores, fresh blocks", mesh_gib_s, plain,
                    note="what cma's copy is: each line read before it is written"))
    rows.append(Row(section, "plain stores GiB/s, source in cache, fresh destination", src_cached, both_cached,
                    note="vs both ends in cache: the most any write into a fresh reservation gets"))
    rows.append(Row(section, "non-temporal stores GiB/s, fresh blocks", streamed, plain,
                    note="vs plain stores: no read before the write, which the kernel's copy does not do"))


def bench_policies(args: argparse.Namespace, rows: list[Row], rng: random.Random) -> None:
    groups, per, prefix_len = (4, 4, 256) if args.quick else (8, 8, 1024)
    prefixes = [[rng.randrange(10, 1000) for _ in range(prefix_len)] for _ in range(groups)]
    prompts = [prefixes[g] + [rng.randrange(10, 1000) for _ in range(32)] for _ in range(per) for g in range(groups)]
    rng.shuffle(prompts)  # arrival order must not line up with round robin's rotation
    # A prefill pool that holds about half the groups' prefixes.
    blocks = (groups // 2) * (prefix_len // 16) + 64
    results = {}
    for policy in ("cache_aware", "round_robin"):
        spec = MeshSpec(model=args.model, prefill=2, decode=1,
                        worker_args=_worker_args(args, 4096), prefill_args=["--num-blocks", str(blocks)],
                        router_args=["--prefill-policy", policy, "--info-interval-s", "0.2"])
        with Mesh(spec) as mesh:
            results[policy] = _mesh_workload(mesh.router_address, prompts, 4, groups)
    ca, rr = results["cache_aware"], results["round_robin"]
    label = f"{groups} groups x {per}, {prefix_len}-token prefix, 2 prefill"
    rows.append(Row("routing: cache_aware vs round_robin", f"hit rate ({label})", ca["hit_rate"], rr["hit_rate"]))
    rows.append(Row("routing: cache_aware vs round_robin", "TTFT p90 s (round_robin / cache_aware)",
                    rr["ttft_p90"], ca["ttft_p90"]))


def run_mesh_bench(args: argparse.Namespace) -> list[Row]:
    rng = random.Random(0)
    rows: list[Row] = []
    sections = set(args.sections or SECTIONS)
    if sections - set(SECTIONS):
        raise SystemExit(f"pdmesh bench mesh: no section {', '.join(sorted(sections - set(SECTIONS)))}; "
                         f"the sections are {', '.join(SECTIONS)}")
    prompts, out = _burst(args, rng)
    if "engine" in sections:
        bench_vs_engine(args, rows, prompts, out)
    if "kv" in sections:
        bench_kv_transfer(args, rows, prompts, out)
    if "routing" in sections:
        bench_policies(args, rows, rng)
    if "index" in sections:
        bench_index(args, rows, rng)
    print(f"\npdmesh bench mesh — model {args.model}, dtype {args.dtype}")
    print(f"{'section':<36} {'metric':<62} {'value':>10} {'baseline':>10} {'ratio':>7}")
    for r in rows:
        base = f"{r.baseline:10.3f}" if r.baseline is not None else f"{'—':>10}"
        ratio = f"{r.ratio:6.2f}x" if r.ratio is not None else ""
        print(f"{r.section:<36} {r.metric:<62} {r.value:10.3f} {base} {ratio:>7} {r.note}")
    report = Path(args.out)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({
        "bench": "mesh", "model": args.model, "dtype": args.dtype, "quick": bool(args.quick),
        "machine": platform.machine(), "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
    }, indent=2) + "\n")
    print(f"wrote {report}")
    return rows
