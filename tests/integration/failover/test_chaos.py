"""Chaos, bounded in time: random SIGKILLs of prefill, decode, kvstore and redis-server
(restarted by the supervisor) under steady load. Every request completes with the no-fault
tokens or fails with a documented status, none outlives its deadline, and every worker
ends with no block in use."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.rpc.health import is_serving
from pdmesh.supervisor import Supervisor
from tests.integration.mesh_tools import wait_idle
from tests.oracle import HFReference, mixed_prompts

DOCUMENTED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
              grpc.StatusCode.DEADLINE_EXCEEDED}
DEADLINE_S = 30.0
LOAD_S = 40.0


@pytest.mark.slow
def test_random_kills_under_load(llama_dir: Path, tmp_path: Path, hf_refs) -> None:  # type: ignore[no-untyped-def]
    ref: HFReference = hf_refs["llama"]
    prompts = mixed_prompts(24, seed=81)
    want = {tuple(p): ref.greedy(p, 12) for p in prompts}
    spec = MeshSpec(model=str(llama_dir), prefill=2, decode=2, kvstore=1,
                    worker_args=["--dtype", "float32", "--num-blocks", "256", "--threads", "1"],
                    router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path / "logs"))
    rng = random.Random(82)
    outcomes: list[str] = []
    late: list[float] = []
    kills: list[str] = []
    with Mesh(spec) as mesh:
        sup = Supervisor(mesh)
        stop = threading.Event()

        def chaos() -> None:
            while not stop.wait(rng.uniform(3.0, 5.0)):
                victim = rng.choice([*mesh.prefill, *mesh.decode, *mesh.kvstore, mesh.redis])
                if victim is not None and victim.popen.poll() is None:
                    victim.popen.kill()
                    kills.append(victim.name)
                sup.check()

        def supervise() -> None:
            while not stop.wait(0.3):
                sup.check()

        def client_loop(seed: int) -> None:
            local = random.Random(seed)
            with Client(mesh.router_address, timeout=DEADLINE_S) as c:
                while not stop.is_set():
                    p = local.choice(prompts)
                    t0 = time.monotonic()
                    try:
                        out = c.complete(p, max_tokens=12, temperature=0)
                        outcomes.append("ok" if out.token_ids == want[tuple(p)] else "WRONG")
                    except grpc.RpcError as exc:
                        outcomes.append(exc.code().name if exc.code() in DOCUMENTED
                                        else f"BAD {exc.code().name}: {exc.details()}")
                        time.sleep(0.2)  # a client backs off before it retries
                    if time.monotonic() - t0 > DEADLINE_S + 2:
                        late.append(time.monotonic() - t0)

        threads = [threading.Thread(target=chaos), threading.Thread(target=supervise)]
        for t in threads:
            t.start()
        with ThreadPoolExecutor(6) as pool:
            loops = [pool.submit(client_loop, i) for i in range(6)]
            time.sleep(LOAD_S)
            stop.set()
            for f in loops:
                f.result()
        for t in threads:
            t.join()
        for _ in range(100):  # let the last killed process come back and serve
            if all(p.popen.poll() is None and (p.name == "redis" or is_serving(p.address))
                   for p in mesh.processes()):
                break
            sup.check()
            time.sleep(0.3)
        wait_idle(mesh)
    counts = {k: outcomes.count(k) for k in set(outcomes)}
    print(f"chaos: kills {kills}; outcomes {counts}")
    assert kills and outcomes
    assert not [k for k in counts if k == "WRONG" or k.startswith("BAD")], counts
    assert counts.get("ok", 0) >= 200, counts  # the mesh kept serving between the kills
    assert late == []
