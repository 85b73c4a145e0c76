"""What the mesh tests share: the workers' flags, fetching their Info, waiting until they
hold nothing, and starting one more service process beside a mesh. A module, not a
conftest, so tests import it as they import any helper."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.rpc.health import is_serving
from pdmesh.rpc.tls import TLSFiles
from pdmesh.start_watch import Proc
from pdmesh.telemetry.scrape import scrape, total
from pdmesh.v1 import admin_pb2_grpc, worker_pb2

POOL_BLOCKS = 256
"""Every test worker's KV pool (a 7-token request takes one 16-token block)."""
WORKER_ARGS = ["--dtype", "float32", "--num-blocks", str(POOL_BLOCKS), "--block-size", "16"]


def admin(mesh: Mesh) -> admin_pb2_grpc.MeshAdminStub:
    return admin_pb2_grpc.MeshAdminStub(grpc.insecure_channel(mesh.router_address))


def info(address: str) -> worker_pb2.WorkerInfo:
    """One worker's Info, straight from the worker."""
    from pdmesh.v1 import worker_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        return worker_pb2_grpc.WorkerStub(ch).Info(worker_pb2.InfoRequest(), timeout=5)


def infos(mesh: Mesh) -> dict[str, worker_pb2.WorkerInfo]:
    """Fresh Info from every worker of the mesh, by name."""
    return {p.name: info(p.address) for p in [*mesh.prefill, *mesh.decode]}


def wait_idle(mesh: Mesh, timeout: float = 20.0, workers: list[Proc] | None = None
              ) -> dict[str, worker_pb2.WorkerInfo]:
    """Wait until no worker (of the mesh, or the ``workers`` given) holds a block for a live
    request (aborts settle asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        state = {p.name: info(p.address) for p in workers} if workers is not None else infos(mesh)
        busy = {n: (i.used_blocks, i.num_handoffs, i.num_running, i.num_waiting) for n, i in state.items()
                if i.used_blocks or i.num_handoffs or i.num_running or i.num_waiting}
        if not busy:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"workers still hold blocks: {busy}")
        time.sleep(0.1)


def kvstore_lookups(mesh: Mesh) -> dict[str, float]:
    """The prefill workers' kvstore lookups, asked and skipped, summed (from their metrics)."""
    samples = [scrape(p.metrics_address) for p in mesh.prefill]
    return {outcome: sum(total(m, "pdmesh_kvstore_lookups_total", outcome=outcome) for m in samples)
            for outcome in ("asked", "skipped")}


def shared_spec(model: Path, log_dir: Path) -> MeshSpec:
    """The mesh the mesh tests share: 2 prefill + 1 decode workers and a kvstore.

    Prefill chunks of 64 tokens: long prompts take several steps, and their finished blocks
    travel to the decode worker while later chunks compute. Fixed core shares: these tests
    assert how routing spreads prompts over the two prefill workers (a flood evicting a
    prefix on both), and lent cores would make one worker measure cheaper than the other
    for a while. Lending has its own tests."""
    return MeshSpec(model=str(model), prefill=2, decode=1, kvstore=1, worker_args=WORKER_ARGS, http_port=0,
                    prefill_args=["--max-num-batched-tokens", "64"], share_cores=False,
                    router_args=["--info-interval-s", "0.2", "--tool-call-parser", "hermes"], log_dir=str(log_dir))


def start_process(tmp_path: Path, name: str, args: list[str], env: dict[str, str] | None = None,
                  tls: TLSFiles | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """One more ``pdmesh`` service process (on port 0), returned once SERVING with its address."""
    import os

    port_file = tmp_path / f"{name}.port"
    log_path = tmp_path / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "pdmesh", *args, "--port", "0", "--port-file", str(port_file)],
                            stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while not (port_file.is_file() and is_serving(f"127.0.0.1:{port_file.read_text().strip()}", tls)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


@contextlib.contextmanager
def extra_process(tmp_path: Path, name: str, args: list[str], env: dict[str, str] | None = None
                  ) -> Iterator[str]:
    """``start_process`` for the length of a ``with`` block; yields the address."""
    proc, address = start_process(tmp_path, name, args, env)
    try:
        yield address
    finally:
        proc.terminate()
        proc.wait(15)


def _router_args(mesh: Mesh, flags: tuple[str, ...], prefill: list[str] | None) -> list[str]:
    prefills = prefill if prefill is not None else [p.address for p in mesh.prefill]
    return ["router", "--model", mesh.spec.model, "--redis-url", mesh.redis_url, "--prefill", ",".join(prefills),
            "--decode", ",".join(p.address for p in mesh.decode), "--info-interval-s", "0.2", *flags]


def start_router(mesh: Mesh, tmp_path: Path, *flags: str, prefill: list[str] | None = None
                 ) -> tuple[subprocess.Popen[bytes], str]:
    """A second router in front of the mesh's workers (or the ``prefill`` ones given), as
    ``start_process`` returns it: the caller stops it."""
    return start_process(tmp_path, "router2", _router_args(mesh, flags, prefill))


def extra_router(mesh: Mesh, tmp_path: Path, *flags: str, prefill: list[str] | None = None
                 ) -> contextlib.AbstractContextManager[str]:
    """``start_router`` for the length of a ``with`` block; yields the address."""
    return extra_process(tmp_path, "router2", _router_args(mesh, flags, prefill))


def small_spec(model: Path, log_dir: Path, **changes: object) -> MeshSpec:
    """One prefill and one decode worker with the test flags, membership polled every 0.2 s."""
    spec = MeshSpec(model=str(model), prefill=1, decode=1, worker_args=WORKER_ARGS,
                    router_args=["--info-interval-s", "0.2"], log_dir=str(log_dir))
    for name, value in changes.items():
        setattr(spec, name, value)
    return spec
