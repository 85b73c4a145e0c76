"""Decode workers that share one machine's cores, as `pdmesh up` starts them: the router
fills the first one's batch before the second gets a request (``--decode-policy pack``),
and the second takes what the first has no room for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.telemetry.scrape import scrape, total
from pdmesh.v1 import admin_pb2
from tests.integration.mesh_tools import WORKER_ARGS, admin, infos, wait_idle

BATCH = 3
"""Each decode worker's --max-num-seqs."""
OUT = 160
"""Tokens per request: enough that a burst's streams overlap on a slow machine too."""


@pytest.fixture(scope="module")
def packed(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(llama_dir), prefill=0, decode=2, worker_args=WORKER_ARGS,
                    decode_args=["--max-num-seqs", str(BATCH)], router_args=["--info-interval-s", "0.2"],
                    log_dir=str(tmp_path_factory.mktemp("packing-logs")))
    colocated = spec.colocated_router_args()
    assert colocated == ["--decode-policy", "pack"], colocated  # what `pdmesh up` adds on one machine
    spec.router_args += colocated
    with Mesh(spec) as m:
        yield m


def test_one_decode_workers_batch_fills_before_the_next(packed: Mesh) -> None:
    assert {i.max_num_seqs for i in infos(packed).values()} == {BATCH}
    stub = admin(packed)
    # The router needs each worker's limit (its Info) before it packs; it asks every 0.2 s.
    deadline = time.monotonic() + 10
    while not all(w.info.max_num_seqs for w in stub.ListWorkers(admin_pb2.ListWorkersRequest()).workers):
        assert time.monotonic() < deadline, "the router never heard the workers' batch limits"
        time.sleep(0.05)
    first, second = sorted(i.worker_id for i in infos(packed).values())

    peaks: dict[str, int] = {first: 0, second: 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for w in stub.ListWorkers(admin_pb2.ListWorkersRequest()).workers:
                if w.role == "decode":
                    peaks[w.info.worker_id] = max(peaks[w.info.worker_id], w.in_flight)
            time.sleep(0.01)

    def one(i: int) -> int:
        with Client(packed.router_address, timeout=120) as c:
            return len(c.complete([5 + i] * 20, max_tokens=OUT, temperature=0, ignore_eos=True).token_ids)

    def burst(n: int) -> list[int]:
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(one, range(n)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert burst(BATCH) == [OUT] * BATCH
        assert peaks == {first: BATCH, second: 0}, peaks  # all of them on one worker
        _until_idle(stub)
        served = _served(packed)
        assert burst(BATCH + 2) == [OUT] * (BATCH + 2)
    finally:
        done.set()
        watcher.join(5)
    # The second took what the first had no room for, counted by what each finished (a
    # sampled peak missed the second's two overlapping by less than a sample once).
    now = _served(packed)
    assert {n: now[n] - served[n] for n in now} == {first: BATCH, second: 2}
    assert peaks[first] == BATCH and peaks[second] <= 2, peaks
    stats = stub.RouterStats(admin_pb2.RouterStatsRequest())
    # The second burst's first prompts are the first burst's: their holder takes them again.
    assert stats.decisions["decode/pack"] + stats.decisions["decode/holder"] == 2 * BATCH + 2
    wait_idle(packed)


def _until_idle(stub) -> None:  # type: ignore[no-untyped-def]
    """Wait until the router counts no request in flight: a caller has its last token a
    moment before the router's count drops, and a burst sent in that moment finds the first
    worker still full (CI saw the second worker take 3 of the second burst, not 2)."""
    deadline = time.monotonic() + 10
    while any(w.in_flight for w in stub.ListWorkers(admin_pb2.ListWorkersRequest()).workers):
        assert time.monotonic() < deadline, "the router still counts requests in flight"
        time.sleep(0.02)


def _served(mesh: Mesh) -> dict[str, int]:
    """Requests each decode worker finished (its ``pdmesh_requests_total``), by worker id."""
    return {p.name: int(total(scrape(p.metrics_address), "pdmesh_requests_total")) for p in mesh.decode}
