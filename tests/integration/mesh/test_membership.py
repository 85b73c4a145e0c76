"""Workers join and leave a running mesh through Redis: no router restart, nothing lost."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import WORKER_ARGS, admin, info, start_process

SEEN_WITHIN_S = 5.0
"""Membership poll (0.5 s) + an Info call; generous for a loaded 2-core CI machine."""


@pytest.fixture(scope="module")
def live_mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=0, worker_args=WORKER_ARGS,
                    router_args=["--info-interval-s", "0.2", "--membership-interval-s", "0.2"],
                    log_dir=str(tmp_path_factory.mktemp("membership-logs")))
    with Mesh(spec) as m:
        yield m


def start_worker(mesh: Mesh, tmp: Path, role: str, name: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """A worker started with only the mesh's Redis URL (no router knows its address)."""
    return start_process(tmp, name, [role, "--model", mesh.spec.model, "--worker-id", name,
                                     "--redis-url", mesh.redis_url, "--threads", "1",
                                     "--leave-notice-s", "0.6", *WORKER_ARGS, *extra])


def listed(mesh: Mesh) -> dict[str, admin_pb2.WorkerStatus]:
    return {w.address: w for w in admin(mesh).ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5).workers}


def healthy(mesh: Mesh, address: str) -> bool:
    """One ListWorkers read (two could straddle the worker's removal)."""
    status = listed(mesh).get(address)
    return status is not None and status.healthy


def status_table(mesh: Mesh) -> str:
    """What ``pdmesh status ROUTER`` prints."""
    out = subprocess.run([sys.executable, "-m", "pdmesh", "status", mesh.router_address],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def wait_for(cond, timeout: float = SEEN_WITHIN_S) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


def run_load(mesh: Mesh, n: int, max_tokens: int, errors: list[BaseException], seed: int) -> threading.Thread:
    def one(i: int) -> None:
        try:
            with Client(mesh.router_address, timeout=120) as c:
                out = c.complete([5 + seed, 7 + i, 11, 13 + i] * 6, max_tokens=max_tokens, temperature=0,
                                 ignore_eos=True)
                assert len(out.token_ids) == max_tokens
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()

    def join_all() -> None:
        for t in threads:
            t.join(180)

    waiter = threading.Thread(target=join_all)
    waiter.start()
    return waiter


def test_workers_join_take_traffic_drain_and_expire(live_mesh: Mesh, tmp_path: Path) -> None:
    spawned = time.monotonic()
    p2, p2_addr = start_worker(live_mesh, tmp_path, "prefill", "prefill-late")
    serving_s = time.monotonic() - spawned
    d2, d2_addr = start_worker(live_mesh, tmp_path, "decode", "decode-late")
    try:
        joined_s = wait_for(lambda: all(healthy(live_mesh, a)
                                        for a in (p2_addr, d2_addr)))
        table = status_table(live_mesh)
        assert "prefix index: ok" in table
        for name in ("prefill-late", "decode-late"):
            row = next(line for line in table.splitlines() if name in line)
            assert "serving" in row and "redis" in row, table
        errors: list[BaseException] = []
        run_load(live_mesh, 16, 8, errors, seed=0).join(180)
        assert not errors
        assert info(p2_addr).computed_prompt_tokens > 0, "the new prefill worker got no request"
        assert info(d2_addr).cached_blocks > 0, "the new decode worker got no request"

        # Drain the new decode worker while streams run through the mesh: none may fail.
        errors = []
        waiter = run_load(live_mesh, 12, 48, errors, seed=1)
        wait_for(lambda: info(d2_addr).num_running > 0)  # streams run on it as it drains
        d2.send_signal(signal.SIGTERM)
        gone_s = wait_for(lambda: not healthy(live_mesh, d2_addr))
        waiter.join(180)
        assert not errors, errors[:3]
        assert d2.wait(30) == 0

        # A worker that dies without leaving is taken out of service when its Info fails,
        # and forgotten once its membership record has expired too (5 s TTL).
        p2.kill()
        expired_s = wait_for(lambda: not healthy(live_mesh, p2_addr))
        wait_for(lambda: p2_addr not in listed(live_mesh), timeout=5.0 + SEEN_WITHIN_S)
        errors = []
        run_load(live_mesh, 4, 4, errors, seed=2).join(180)
        assert not errors
        print(f"\nprocess start to serving {serving_s:.2f} s, then to routable {joined_s:.2f} s; leave on SIGTERM {gone_s:.2f} s, expiry after SIGKILL {expired_s:.2f} s")
    finally:
        for p in (p2, d2):
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_a_mismatched_worker_joining_is_refused_with_the_reason(live_mesh: Mesh, tmp_path: Path) -> None:
    proc, addr = start_worker(live_mesh, tmp_path, "decode", "decode-odd", "--block-size", "8")
    try:
        wait_for(lambda: (listed(live_mesh).get(addr) or admin_pb2.WorkerStatus()).refused_reason != "")
        status = listed(live_mesh)[addr]
        assert not status.healthy and status.state == "refused" and "block_size 8" in status.refused_reason
        row = next(line for line in status_table(live_mesh).splitlines() if "decode-odd" in line)
        assert "refused" in row and "block_size 8 differs" in row
        errors: list[BaseException] = []
        run_load(live_mesh, 4, 4, errors, seed=3).join(180)
        assert not errors
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_member_whose_key_expires_is_forgotten(live_mesh: Mesh) -> None:
    """Fault injection at the membership itself: a record nobody renews, for an address
    where nothing answers, is listed (down) while it lives and forgotten once it expires."""
    import json

    import redis

    client = redis.Redis.from_url(live_mesh.redis_url)
    ghost = {"role": "decode", "worker_id": "decode-ghost", "address": "127.0.0.1:9", "epoch": "e0"}
    client.set("pdmesh:member:decode:decode-ghost", json.dumps(ghost), px=1500)
    client.sadd("pdmesh:members", "pdmesh:member:decode:decode-ghost")  # as a worker announces
    wait_for(lambda: "127.0.0.1:9" in listed(live_mesh))
    assert not listed(live_mesh)["127.0.0.1:9"].healthy  # nothing answers there
    gone_s = wait_for(lambda: "127.0.0.1:9" not in listed(live_mesh), timeout=1.5 + SEEN_WITHIN_S)
    print(f"\nunrenewed member forgotten {gone_s:.2f} s after it was listed (TTL 1.5 s)")


def test_an_expired_record_alone_takes_no_worker_out_of_service(live_mesh: Mesh) -> None:
    """A worker under heavy load may miss renewals: its record expiring must not stop
    routing to a worker that still answers (death is decided by its Info calls)."""
    import redis

    client = redis.Redis.from_url(live_mesh.redis_url)
    decode = live_mesh.decode[0]
    key = "pdmesh:member:decode:decode-0"
    assert client.exists(key)
    ttl_before = client.pttl(key)
    # As if its renewals had stopped long enough for the record to expire: deleted again
    # until a poll of the router's has found no record (the worker renews it every second).
    wait_for(lambda: client.delete(key) >= 0 and not listed(live_mesh)[decode.address].member)
    assert listed(live_mesh)[decode.address].healthy
    with Client(live_mesh.router_address, timeout=60) as c:
        assert len(c.complete([5, 6, 7, 8], max_tokens=2, temperature=0).token_ids) == 2
    wait_for(lambda: client.exists(key))  # the worker renews it on its own
    assert ttl_before > 0
