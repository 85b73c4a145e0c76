"""A lone request's time to first token: the mesh against one worker and against an engine
in this process (``pdmesh bench mesh``, section engine).

Goal 3 of the speed issue: the mesh adds at most 5 ms p50 to a lone request over one worker
on the same cores. Both are started as ``pdmesh up`` starts them: 1 prefill + 1 decode with
the kvstore, and ``--prefill 0 --decode 1``. Each request goes through one of the three
with a fresh prompt, and the three take turns request by request: measured one after the
other, the two halves of such a figure landed in different phases of a drifting machine
(+5.5 to +37.8 ms in three runs on a 2-core Zen 3; docs/performance/log.md §26). The meshes
idle while another one serves. A gap of 2.5x ``LEND_AFTER_IDLE_S`` before each request
lets an idle worker lend its cores again, as ``scripts/probes/mesh/lone_ttft_hops.py`` does. What a
request costs beyond its forward pass is split at the forward: the hops before it (the
router's lookup and calls) and after it (the KV write, the answer, the relay).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdmesh.bench.report_row import Row
from pdmesh.bench.stats import pct
from pdmesh.engine.step_log import ENV, read_steps
from pdmesh.launcher import Mesh, MeshSpec

WAYS = ("mesh", "one worker", "in process")


@dataclass
class Lone:
    """One request of the row."""

    way: str
    started: float
    """``time.monotonic()`` when it was sent (the clock step logs use, in every process)."""
    ttft: float
    forward: float | None = None
    """Its prompt's forward pass in whichever process ran it, from the step logs."""
    before: float | None = None
    """From sending it to its first forward step's start: the hops and hand-offs on the way in."""
    after: float | None = None
    """From its last forward step's end to its first token: the way out (a KV write in the mesh)."""


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
    with tempfile.TemporaryDirectory(prefix="pdmesh-lone-") as tmp:
        lone = lone_ttfts(args, {"mesh": mesh, "one worker": one}, prompts, threads, Path(tmp) / "steps")
    ttft = _p50_ms(lone, lambda r: r.ttft)
    label = f"{plen}-token prompts, {args.lone_tokens} token(s) out, one at a time, {n} each way"
    rows.append(Row("lone request", f"TTFT p50 added vs one worker ({label}) (ms)", ttft["mesh"] - ttft["one worker"],
                    note=_by_way(ttft)))
    rows.append(Row("lone request", f"TTFT p50 added vs in process, {threads} thread(s) (ms)",
                    ttft["mesh"] - ttft["in process"], note="the engine alone: no gRPC, no server"))
    timed = [r for r in lone if r.forward is not None]
    if {r.way for r in timed} != set(WAYS):
        return  # a way whose forward passes no step log timed: nothing to subtract
    rest = _p50_ms(timed, lambda r: r.ttft - (r.forward or 0.0))
    fwd = _p50_ms(timed, lambda r: r.forward or 0.0)
    rows.append(Row("lone request", "TTFT p50 beyond the forward pass, added vs one worker (ms)",
                    rest["mesh"] - rest["one worker"],
                    note=f"TTFT - forward: {_by_way(rest)}; forward: {_by_way(fwd)}"))
    for side in ("before", "after"):
        ms = _p50_ms(timed, functools.partial(_phase_s, side))
        rows.append(Row("lone request", f"TTFT p50 {side} the forward pass, added vs one worker (ms)",
                        ms["mesh"] - ms["one worker"], note=f"{side} the forward: {_by_way(ms)}"))


def _phase_s(side: str, request: Lone) -> float:
    """Seconds ``before`` or ``after`` the forward pass (0 where the step log has none)."""
    return getattr(request, side) or 0.0


def _p50_ms(requests: list[Lone], seconds: Callable[[Lone], float]) -> dict[str, float]:
    """Each way's p50 of ``seconds(request)``, in ms."""
    return {way: 1000 * pct([seconds(r) for r in requests if r.way == way], 0.5) for way in WAYS}


def _by_way(ms: dict[str, float]) -> str:
    return " / ".join(f"{way} {ms[way]:.1f}" for way in WAYS)


def lone_ttfts(args: argparse.Namespace, specs: dict[str, MeshSpec], prompts: list[list[int]],
               threads: int, step_log: Path) -> list[Lone]:
    """Each prompt's first token by way (``specs``' meshes and an engine in this process on
    ``threads``), the ways taking turns in a shuffled order each round; every process logs
    its steps to ``step_log`` (``PDMESH_STEP_LOG``), whose forward passes are matched to the
    requests by time. A process computes at its own pace for its life (on a 2-core Zen 3
    the same prompt's forward p50 differed by up to 15% between processes), so TTFT less
    the forward is what the mesh's hops cost."""
    import torch

    from pdmesh.bench.engine import _run_engine
    from pdmesh.client import Client
    from pdmesh.engine.async_engine import LEND_AFTER_IDLE_S
    from pdmesh.engine.llm_engine import LLMEngine

    tokens = args.lone_tokens  # the first is timed; more take the mesh's Decode path after it

    order = random.Random(2)
    out: list[Lone] = []
    saved = torch.get_num_threads()
    saved_env = os.environ.get(ENV)
    os.environ[ENV] = str(step_log)  # the meshes' processes and this engine log their steps
    try:
        engine = LLMEngine.from_model(args.model, dtype=args.dtype, threads=threads)
        with contextlib.ExitStack() as stack:
            clients = {way: stack.enter_context(Client(stack.enter_context(Mesh(spec)).router_address))
                       for way, spec in specs.items()}

            def first_token(way: str, prompt: list[int]) -> Lone:
                t0 = time.monotonic()
                if way == "in process":
                    return Lone(way, t0, _run_engine(engine, [prompt], tokens)["ttft_p50"])
                first = 0.0
                for resp in clients[way].generate(prompt, max_tokens=tokens, temperature=0):
                    first = first or (time.monotonic() - t0 if resp.token_ids else 0.0)
                return Lone(way, t0, first)  # read to the end: a stream left early is cancelled meanwhile

            for way in WAYS:  # warm-up: connections, NIXL peers, the engine's first steps
                first_token(way, list(reversed(prompts[0])))
            turns = iter(prompts)
            for _ in range(len(prompts) // len(WAYS)):
                for way in order.sample(WAYS, len(WAYS)):
                    time.sleep(2.5 * LEND_AFTER_IDLE_S)
                    out.append(first_token(way, next(turns)))
    finally:
        torch.set_num_threads(saved)
        if saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved_env
    _match_forwards(out, step_log)
    return out


def _match_forwards(requests: list[Lone], step_log: Path) -> None:
    """Each request's forward passes: the prompt steps that began while it waited for its
    first token (one at a time, so no other request's)."""
    steps = [(step.start_s, step.forward_s) for path in step_log.parent.glob(f"{step_log.name}.*")
             for step in read_steps(path) if step.prompt_tokens]
    for r in requests:
        mine = [(start, sec) for start, sec in steps if r.started <= start <= r.started + r.ttft]
        if mine:
            r.forward = sum(sec for _, sec in mine)
            r.before = min(start for start, _ in mine) - r.started
            r.after = r.started + r.ttft - max(start + sec for start, sec in mine)
