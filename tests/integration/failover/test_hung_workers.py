"""A worker that hangs instead of dying: its process stopped (SIGSTOP) or its engine stuck
while the process answers (``PDMESH_FAULT_STEP_STALL``). Every stream completes with the
tokens of a run without the fault, the requests sent meanwhile complete, all of it before
the hang ends, and once the worker goes on no block is left anywhere.

"Before the hang ends" is the feature: the hang lasts ``HANG_S``; the mesh finds a stopped
process in ~1.5 s (its connection's pings) and a stuck engine in ``--stall-floor-s`` (2 s),
and moves its streams in ~0.3 s more (``pdmesh bench stalls``: largest gap p99 1.9-2.1 s).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pdmesh.client import Client
from pdmesh.engine.faults import STEP_STALL_ENV
from pdmesh.launcher import Mesh
from pdmesh.start_watch import Proc
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import admin, info, small_spec, wait_idle
from tests.oracle import mixed_prompts

HANG_S = 10.0
"""How long a worker hangs: 4-6x what the mesh takes to move its streams."""
MAX_NEW = 160


def _requests() -> list[tuple[list[int], dict[str, object]]]:
    prompts = mixed_prompts(24, seed=91)
    return ([(p, {"temperature": 0}) for p in prompts[:16]]
            + [(p, {"temperature": 0.8, "top_p": 0.95, "seed": 200 + i}) for i, p in enumerate(prompts[16:])])


class Run:
    """Streams on threads: each one's tokens and the monotonic time it ended."""

    def __init__(self, address: str, requests: list[tuple[list[int], dict[str, object]]], max_new: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in requests]
        self.ended = [float("inf")] * len(requests)
        self.total = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(len(requests))
        self._futures = [self._pool.submit(self._one, address, i, p, s, max_new)
                         for i, (p, s) in enumerate(requests)]

    def _one(self, address: str, i: int, prompt: list[int], sampling: dict[str, object], max_new: int) -> None:
        with Client(address, timeout=120) as c:
            for resp in c.generate(prompt, max_tokens=max_new, ignore_eos=True, **sampling):
                self.tokens[i] += resp.token_ids
                with self._lock:
                    self.total += len(resp.token_ids)
        self.ended[i] = time.monotonic()

    def until(self, tokens: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.total < tokens:
            assert time.monotonic() < deadline, f"{self.total} tokens streamed, not {tokens}"
            time.sleep(0.005)

    def join(self) -> list[list[int]]:
        for f in self._futures:
            f.result(timeout=150)  # a stream's failure is raised here
        self._pool.shutdown()
        return self.tokens


def _reference(address: str, requests: list[tuple[list[int], dict[str, object]]], max_new: int) -> list[list[int]]:
    return Run(address, requests, max_new).join()


@pytest.fixture(scope="module")
def mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with Mesh(small_spec(llama_dir, tmp_path_factory.mktemp("hung-logs"), decode=2)) as m:
        yield m


def test_a_stopped_decode_worker_s_streams_and_new_requests_finish_before_it_goes_on(mesh: Mesh) -> None:
    requests, fresh = _requests(), [(p, {"temperature": 0}) for p in mixed_prompts(4, seed=92)]
    want, want_fresh = _reference(mesh.router_address, requests, MAX_NEW), _reference(mesh.router_address, fresh, 32)
    migrations = admin(mesh).RouterStats(admin_pb2.RouterStatsRequest(), timeout=5).decode_migrations
    run = Run(mesh.router_address, requests, MAX_NEW)
    run.until(10 * len(requests))
    victim = max(mesh.decode, key=lambda p: info(p.address).num_running)
    with _stopped(victim) as stopped_at:
        during = Run(mesh.router_address, fresh, 32)
        got, got_fresh = run.join(), during.join()
        finished = max(run.ended + during.ended)
        assert finished < stopped_at + HANG_S, "the streams waited for the stopped worker"
    assert got == want and got_fresh == want_fresh
    assert admin(mesh).RouterStats(admin_pb2.RouterStatsRequest(), timeout=5).decode_migrations > migrations
    print(f"\nall streams ended {finished - stopped_at:.2f}s after the stop")
    wait_idle(mesh, timeout=15)  # the stopped worker, going on, frees what it held


def test_a_stuck_engine_s_streams_move_and_new_requests_avoid_it(mesh: Mesh, tmp_path: Path) -> None:
    """The engine stops stepping while its process answers Info, Reserve and pings: only
    the gaps in its streams show it."""
    requests = _requests()
    want = _reference(mesh.router_address, requests, MAX_NEW)
    stuck = mesh.spawn("decode-stuck", [
        "decode", "--model", mesh.spec.model, "--worker-id", "decode-stuck", *mesh.port_args("decode-stuck"),
        *mesh.spec.worker_args, "--threads", "1", "--redis-url", mesh.redis_url], {STEP_STALL_ENV: f"10:{HANG_S}"})
    mesh.await_ready(stuck)
    mesh.decode.append(stuck)
    try:
        mesh.restart_router()  # in front of the stuck worker too
        run = Run(mesh.router_address, requests, MAX_NEW)
        deadline = time.monotonic() + 60
        while "s now" not in stuck.log.read_text():
            assert time.monotonic() < deadline, "the fault never stopped the engine"
            time.sleep(0.01)
        stalled_at = time.monotonic()
        got = run.join()
        assert max(run.ended) < stalled_at + HANG_S, "the streams waited for the stuck engine"
        assert got == want
        states = {w.info.worker_id: w.state for w in admin(mesh).ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5).workers}
        print(f"\nall streams ended {max(run.ended) - stalled_at:.2f}s after the stall; states {states}")
        wait_idle(mesh, timeout=HANG_S + 15)
    finally:
        mesh.decode.remove(stuck)
        mesh.kill(stuck)
        mesh.restart_router()


def test_a_decode_worker_stopped_and_continued_every_100_ms_fails_nothing(mesh: Mesh) -> None:
    """A worker that flaps (stopped 100 ms, going on 100 ms) for 8 s under two client loops:
    every request completes with its no-fault tokens, and nothing is left held."""
    prompts = mixed_prompts(400, seed=94)
    want = {i: t for i, t in enumerate(_reference(mesh.router_address, [(p, {"temperature": 0})
                                                                        for p in prompts[:40]], 16))}
    flapping, got, failures = threading.Event(), {}, []

    def loop(k: int) -> None:
        with Client(mesh.router_address, timeout=60) as c:
            for i in range(k, 40, 2):
                try:
                    got[i] = c.complete(prompts[i], max_tokens=16, temperature=0, ignore_eos=True).token_ids
                except Exception as exc:  # noqa: BLE001 - collected for the assertion
                    failures.append(exc)
                if not flapping.is_set():
                    return

    flapping.set()
    loops = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for t in loops:
        t.start()
    victim, until = mesh.decode[0], time.monotonic() + 8
    try:
        while time.monotonic() < until and any(t.is_alive() for t in loops):
            os.kill(victim.popen.pid, signal.SIGSTOP)
            time.sleep(0.1)
            os.kill(victim.popen.pid, signal.SIGCONT)
            time.sleep(0.1)
    finally:
        os.kill(victim.popen.pid, signal.SIGCONT)
        flapping.clear()
        for t in loops:
            t.join(120)
    assert not failures, failures[:3]
    assert got and all(got[i] == want[i] for i in got)
    wait_idle(mesh, timeout=15)


def test_a_stopped_prefill_worker_holding_the_prefixes_is_routed_around(
        llama_dir: Path, tmp_path: Path) -> None:
    spec = small_spec(llama_dir, tmp_path, prefill=2)
    prefixes = [p * 8 for p in mixed_prompts(8, seed=93)[4:]]  # long enough to be worth routing to
    requests = [(p[:96] + [7 + i, 8, 9], {"temperature": 0}) for i, p in enumerate(prefixes * 2)]
    with Mesh(spec) as mesh:
        before = {p.name: info(p.address).computed_prompt_tokens for p in mesh.prefill}
        want = _reference(mesh.router_address, requests, 16)
        holder = max(mesh.prefill, key=lambda p: info(p.address).computed_prompt_tokens - before[p.name])
        with _stopped(holder) as stopped_at:
            run = Run(mesh.router_address, requests, 16)
            got = run.join()
            assert max(run.ended) < stopped_at + HANG_S, "new requests waited for the stopped prefill worker"
        assert got == want
        wait_idle(mesh, timeout=15)


class _stopped:  # noqa: N801 - used as a with-statement, like contextlib's
    """SIGSTOP ``proc`` for the ``with`` block, SIGCONT once ``HANG_S`` has passed (or at once
    when the block failed); yields when it was stopped."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc

    def __enter__(self) -> float:
        os.kill(self.proc.popen.pid, signal.SIGSTOP)
        self.at = time.monotonic()
        return self.at

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            time.sleep(max(0.0, self.at + HANG_S - time.monotonic()))
        os.kill(self.proc.popen.pid, signal.SIGCONT)
