"""A lone request's time to first token: the mesh against one worker and against an engine
in this process (``pdmesh bench mesh``, section engine).

Goal 3 of the speed issue: the mesh adds at most 5 ms p50 to a lone request over one worker
on the same cores. Both are started as ``pdmesh up`` starts them: 1 prefill + 1 decode with
the kvstore, and ``--prefill 0 --decode 1``. Each request goes through one of the three
with a fresh prompt, and the three take turns request by request: measured one after the
other, the two halves of such a figure landed in different phases of a drifting machine
(+5.5 to +37.8 ms in three runs on a 2-core Zen 3; docs/performance.md §26). The meshes
idle while another one serves. A gap of 2.5x ``LEND_AFTER_IDLE_S`` before each request
lets an idle worker lend its cores again, as ``scripts/lone_ttft_hops.py`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import time

from pdmesh.bench.report_row import Row
from pdmesh.bench.stats import pct
from pdmesh.launcher import Mesh, MeshSpec

WAYS = ("mesh", "one worker", "in process")


def bench_lone(args: argparse.Namespace, rows: list[Row], worker_args: list[str], plen: int) -> None:
    n = 4 if args.quick else 24
    rng = random.Random(1)  # prompts no earlier request cached
    prompts = [[rng.randrange(10, 1000) for _ in range(plen)] for _ in range(len(WAYS) * n)]
    mesh = MeshSpec(model=args.model, prefill=1, decode=1, kvstore=1, worker_args=worker_args)
    one = MeshSpec(model=args.model, prefill=0, decode=1, worker_args=worker_args)
    for spec in (mesh, one):
        spec.router_args += spec.colocated_router_args()  # as `pdmesh up` starts it
    cores = os.cpu_count() or 1
    # The engine gets the cores one worker of the mesh computes a lone prompt on.
    threads = args.threads or (cores if mesh.splits_cpu_cores() else max(1, cores // 2))
    ttfts = lone_ttfts(args, {"mesh": mesh, "one worker": one}, prompts, threads)
    p50 = {way: 1000 * pct(ttfts[way], 0.5) for way in WAYS}
    note = " / ".join(f"{way} {p50[way]:.1f}" for way in WAYS)
    label = f"{plen}-token prompts, one at a time, {n} each way"
    rows.append(Row("lone request", f"TTFT p50 added vs one worker ({label}) (ms)",
                    p50["mesh"] - p50["one worker"], note=note))
    rows.append(Row("lone request", f"TTFT p50 added vs in process, {threads} thread(s) (ms)",
                    p50["mesh"] - p50["in process"], note="the engine alone: no gRPC, no server"))


def lone_ttfts(args: argparse.Namespace, specs: dict[str, MeshSpec], prompts: list[list[int]],
               threads: int) -> dict[str, list[float]]:
    """Seconds to the first token of each prompt by way (``specs``' meshes and an engine in
    this process on ``threads``), the ways taking turns in a shuffled order each round."""
    import torch

    from pdmesh.bench.engine import _run_engine
    from pdmesh.client import Client
    from pdmesh.engine.async_engine import LEND_AFTER_IDLE_S
    from pdmesh.engine.llm_engine import LLMEngine

    order = random.Random(2)
    out: dict[str, list[float]] = {way: [] for way in WAYS}
    saved = torch.get_num_threads()
    engine = LLMEngine.from_model(args.model, dtype=args.dtype, threads=threads)
    try:
        with contextlib.ExitStack() as stack:
            clients = {way: stack.enter_context(Client(stack.enter_context(Mesh(spec)).router_address))
                       for way, spec in specs.items()}

            def first_token(way: str, prompt: list[int]) -> float:
                if way == "in process":
                    return _run_engine(engine, [prompt], 1)["ttft_p50"]
                t0 = time.monotonic()
                first = 0.0
                for resp in clients[way].generate(prompt, max_tokens=1, temperature=0):
                    first = first or (time.monotonic() - t0 if resp.token_ids else 0.0)
                return first  # read to the end: a stream left early is cancelled meanwhile

            for way in WAYS:  # warm-up: connections, NIXL peers, the engine's first steps
                first_token(way, list(reversed(prompts[0])))
            turns = iter(prompts)
            for _ in range(len(prompts) // len(WAYS)):
                for way in order.sample(WAYS, len(WAYS)):
                    time.sleep(2.5 * LEND_AFTER_IDLE_S)
                    out[way].append(first_token(way, next(turns)))
    finally:
        torch.set_num_threads(saved)
    return out
