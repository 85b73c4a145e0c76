"""The hung-worker scenarios of ``pdmesh bench stalls``: a worker whose process stays up
but stops answering (SIGSTOP), on a real mesh, measured from the client's side.

Each scenario starts its own mesh, runs its streams once without a fault (the reference
tokens), then again with the fault, and records per stream whether it completed, whether
its tokens equal the reference, its TTFT and its largest gap between two responses; after
the stopped worker is continued, whether every worker's pool is empty again.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from pdmesh.bench.stats import pct
from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.rpc.clients import fetch_info_blocking
from pdmesh.start_watch import Proc

STREAM_DEADLINE_S = 60.0
"""The client's deadline for every request: what a hung mesh made each of them wait."""


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    seed: int | None = None
    """None: greedy."""


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    code: str = "OK"
    ttft_s: float = float("nan")
    largest_gap_s: float = 0.0
    started_at: float = 0.0
    """Monotonic time the request was sent."""


def run_one(address: str, req: Request, progress: Callable[[int], None] | None = None) -> Outcome:
    """One streamed request; ``progress(tokens so far)`` after each response."""
    out = Outcome(started_at=time.monotonic())
    last = out.started_at
    options: dict[str, Any] = {"temperature": 0} if req.seed is None else {"temperature": 1.0, "seed": req.seed}
    try:
        with Client(address, timeout=STREAM_DEADLINE_S) as c:
            for resp in c.generate(req.prompt, max_tokens=req.max_tokens, ignore_eos=True, **options):
                now = time.monotonic()
                if not out.tokens:
                    out.ttft_s = now - out.started_at
                else:
                    out.largest_gap_s = max(out.largest_gap_s, now - last)
                last = now
                out.tokens.extend(resp.token_ids)
                if progress is not None:
                    progress(len(out.tokens))
    except grpc.RpcError as exc:
        out.code = exc.code().name
    return out


def run_all(address: str, reqs: list[Request], progress: Callable[[int, int], None] | None = None
            ) -> tuple[list[threading.Thread], list[Outcome]]:
    """Start every request on its own thread; the threads and the outcomes they fill."""
    outcomes = [Outcome() for _ in reqs]

    def go(i: int) -> None:
        outcomes[i] = run_one(address, reqs[i], (lambda n: progress(i, n)) if progress else None)

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(reqs))]
    for t in threads:
        t.start()
    return threads, outcomes


def used_blocks(mesh: Mesh) -> dict[str, int]:
    """Blocks held for live requests on every worker (``used_blocks`` + hand-offs)."""
    out = {}
    for p in [*mesh.prefill, *mesh.decode]:
        info = fetch_info_blocking(p.address, timeout=5)
        out[p.name] = info.used_blocks + info.num_handoffs
    return out


def settled(mesh: Mesh, within_s: float) -> dict[str, int]:
    """``used_blocks`` once every worker holds none, or as it stands after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            held = used_blocks(mesh)
        except grpc.RpcError as exc:
            held = {"unreachable": 1, exc.code().name: 1}
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def stop(proc: Proc) -> None:
    os.kill(proc.popen.pid, signal.SIGSTOP)


def cont(proc: Proc) -> None:
    os.kill(proc.popen.pid, signal.SIGCONT)


def prompts(n: int, seed: int, lo: int = 16, hi: int = 120, vocab: int = 1000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


@dataclass
class CaseResult:
    """One scenario's figures, as the report prints them."""

    case: str
    in_flight: list[Outcome]
    reference: list[list[int]]
    new: list[Outcome]
    held_after: dict[str, int]
    notes: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        done = [o for o in self.in_flight if o.code == "OK"]
        exact = sum(o.tokens == want for o, want in zip(self.in_flight, self.reference, strict=True))
        new_ok = [o for o in self.new if o.code == "OK"]
        gaps = [o.largest_gap_s for o in done]
        ttfts = [o.ttft_s for o in new_ok]
        return {
            "case": self.case,
            "in_flight_completed": f"{len(done)}/{len(self.in_flight)}" if self.in_flight else "-",
            "in_flight_exact": f"{exact}/{len(self.in_flight)}" if self.in_flight else "-",
            "largest_gap_p50_s": pct(gaps, 0.5), "largest_gap_p99_s": pct(gaps, 0.99),
            "new_completed": f"{len(new_ok)}/{len(self.new)}",
            "new_ttft_p50_s": pct(ttfts, 0.5), "new_ttft_p99_s": pct(ttfts, 0.99),
            "failures": sorted({o.code for o in [*self.in_flight, *self.new] if o.code != "OK"}),
            "blocks_held_after": sum(self.held_after.values()),
            **self.notes,
            "largest_gaps_s": [round(g, 3) for g in gaps],
            "new_ttfts_s": [round(t, 3) for t in ttfts],
        }


def decode_stopped(model: str, worker_args: list[str], log_dir: str, hang_s: float = 10.0) -> CaseResult:
    """1 prefill + 2 decode workers; 16 greedy + 8 seeded streams of 96 tokens; the decode
    worker serving most of them stopped ~10 tokens in, 4 new requests sent during the hang,
    the worker continued after ``hang_s``."""
    spec = MeshSpec(model=model, prefill=1, decode=2, kvstore=0, worker_args=worker_args, log_dir=log_dir)
    reqs = [Request(p, 96, None if i < 16 else i) for i, p in enumerate(prompts(24, seed=1))]
    fresh = [Request(p, 32) for p in prompts(4, seed=2)]
    with Mesh(spec) as mesh:
        reference = [run_one(mesh.router_address, r).tokens for r in reqs]
        settled(mesh, 15)
        counts = [0] * len(reqs)
        started = threading.Event()

        def progress(i: int, n: int) -> None:
            counts[i] = n
            if sum(counts) >= 10 * len(reqs):
                started.set()

        threads, outcomes = run_all(mesh.router_address, reqs, progress)
        started.wait(STREAM_DEADLINE_S)
        running = {p.name: fetch_info_blocking(p.address, timeout=5).num_running for p in mesh.decode}
        victim = max(mesh.decode, key=lambda p: running[p.name])
        stop(victim)
        stopped_at = time.monotonic()
        new_threads, new = run_all(mesh.router_address, fresh)
        time.sleep(max(0.0, stopped_at + hang_s - time.monotonic()))
        cont(victim)
        for t in [*threads, *new_threads]:
            t.join(STREAM_DEADLINE_S + 5)
        held = settled(mesh, 15)
    return CaseResult("decode stopped", outcomes, reference, new, held,
                      {"stopped_streams": running[victim.name]})


def engine_stuck(model: str, worker_args: list[str], log_dir: str, stall_s: float = 10.0) -> CaseResult:
    """1 prefill + 2 decode workers, one of whose engines stops stepping for ``stall_s`` after
    its 10th step while its process answers everything else (``PDMESH_FAULT_STEP_STALL``:
    what SIGSTOP cannot cause); the same 24 streams, 4 new requests during the stall."""
    from pdmesh.engine.faults import STEP_STALL_ENV

    spec = MeshSpec(model=model, prefill=1, decode=1, kvstore=0, worker_args=worker_args, log_dir=log_dir)
    reqs = [Request(p, 96, None if i < 16 else i) for i, p in enumerate(prompts(24, seed=1))]
    fresh = [Request(p, 32) for p in prompts(4, seed=2)]
    with Mesh(spec) as mesh:
        reference = [run_one(mesh.router_address, r).tokens for r in reqs]
        stuck = mesh.spawn("decode-stuck", [
            "decode", "--model", model, "--worker-id", "decode-stuck", *mesh.port_args("decode-stuck"),
            *worker_args, "--threads", "1", "--redis-url", mesh.redis_url], {STEP_STALL_ENV: f"10:{stall_s}"})
        mesh.await_ready(stuck)
        mesh.decode.append(stuck)
        mesh.restart_router()
        threads, outcomes = run_all(mesh.router_address, reqs)
        deadline = time.monotonic() + STREAM_DEADLINE_S
        log = stuck.log
        if log is None:
            raise RuntimeError("the stalled worker was started without a log file to watch")
        while "s now" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)  # its engine has stopped: send the new requests
        new_threads, new = run_all(mesh.router_address, fresh)
        for t in [*threads, *new_threads]:
            t.join(STREAM_DEADLINE_S + 5)
        held = settled(mesh, stall_s + 15)
    return CaseResult("decode engine stuck", outcomes, reference, new, held)


def prefill_stopped(model: str, worker_args: list[str], log_dir: str, hang_s: float = 10.0) -> CaseResult:
    """2 prefill + 1 decode workers; 4 prefixes cached on one prefill worker by earlier
    requests, that worker stopped, 8 new requests on those prefixes sent during the hang."""
    spec = MeshSpec(model=model, prefill=2, decode=1, kvstore=0, worker_args=worker_args, log_dir=log_dir)
    heads = prompts(4, seed=3, lo=96, hi=97)
    warm = [Request(h + t, 4) for h, t in zip(heads, prompts(4, seed=4, lo=8, hi=9), strict=True)]
    fresh = [Request(heads[i % 4] + t, 16) for i, t in enumerate(prompts(8, seed=5, lo=8, hi=9))]
    with Mesh(spec) as mesh:
        before = {p.name: fetch_info_blocking(p.address, timeout=5).computed_prompt_tokens for p in mesh.prefill}
        for r in warm:
            run_one(mesh.router_address, r)
        after = {p.name: fetch_info_blocking(p.address, timeout=5).computed_prompt_tokens for p in mesh.prefill}
        holder = max(mesh.prefill, key=lambda p: after[p.name] - before[p.name])
        reference = [run_one(mesh.router_address, r).tokens for r in fresh]
        stop(holder)
        stopped_at = time.monotonic()
        threads, new = run_all(mesh.router_address, fresh)
        time.sleep(max(0.0, stopped_at + hang_s - time.monotonic()))
        cont(holder)
        for t in threads:
            t.join(STREAM_DEADLINE_S + 5)
        held = settled(mesh, 15)
    exact = sum(o.tokens == want for o, want in zip(new, reference, strict=True))
    return CaseResult("prefill stopped", [], [], new, held, {"new_exact": f"{exact}/{len(new)}"})


def flapping(model: str, worker_args: list[str], log_dir: str, seconds: float = 20.0) -> CaseResult:
    """1 prefill + 2 decode workers under a closed loop of 4 clients; one decode worker
    stopped and continued every 100 ms for ``seconds``: nothing may fail, and its share of
    the requests (its finished-request count) should fall."""
    spec = MeshSpec(model=model, prefill=1, decode=2, kvstore=0, worker_args=worker_args, log_dir=log_dir)
    with Mesh(spec) as mesh:
        victim, other = mesh.decode
        outcomes: list[Outcome] = []
        done = threading.Event()

        def client(k: int) -> None:
            for n, p in enumerate(prompts(10_000, seed=10 + k)):
                if done.is_set():
                    return
                outcomes.append(run_one(mesh.router_address, Request(p, 16, seed=n)))

        def served() -> tuple[int, int]:
            return tuple(_finished(p) for p in (victim, other))  # type: ignore[return-value]

        loops = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
        for t in loops:
            t.start()
        time.sleep(seconds / 2)  # the share before the fault
        calm = served()
        flap_until = time.monotonic() + seconds
        while time.monotonic() < flap_until:
            stop(victim)
            time.sleep(0.1)
            cont(victim)
            time.sleep(0.1)
        flapped = served()
        done.set()
        for t in loops:
            t.join(STREAM_DEADLINE_S + 5)
        held = settled(mesh, 15)

    def share(a: tuple[int, int], b: tuple[int, int]) -> float:
        mine, theirs = a[0] - b[0], a[1] - b[1]
        return mine / max(1, mine + theirs)

    return CaseResult("decode flapping 100/100 ms", [], [], outcomes, held, {
        "share_before": round(share(calm, (0, 0)), 3), "share_flapping": round(share(flapped, calm), 3)})


def _finished(p: Proc) -> int:
    from pdmesh.telemetry.scrape import scrape, total

    return int(total(scrape(p.metrics_address), "pdmesh_requests_total"))
