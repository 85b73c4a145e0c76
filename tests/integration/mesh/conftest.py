"""A real mesh for the module: redis-server, 2 prefill + 1 decode workers, the router."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.rpc.health import is_serving
from pdmesh.rpc.tls import TLSFiles
from pdmesh.v1 import admin_pb2_grpc, worker_pb2

POOL_BLOCKS = 256
"""Every test worker's KV pool (a 7-token request takes one 16-token block)."""
WORKER_ARGS = ["--dtype", "float32", "--num-blocks", str(POOL_BLOCKS), "--block-size", "16"]


def admin(mesh: Mesh) -> admin_pb2_grpc.MeshAdminStub:
    return admin_pb2_grpc.MeshAdminStub(grpc.insecure_channel(mesh.router_address))


def infos(mesh: Mesh) -> dict[str, worker_pb2.WorkerInfo]:
    """Fresh Info from every worker, straight from the workers."""
    from pdmesh.v1 import worker_pb2_grpc

    out = {}
    for p in [*mesh.prefill, *mesh.decode]:
        with grpc.insecure_channel(p.address) as ch:
            out[p.name] = worker_pb2_grpc.WorkerStub(ch).Info(worker_pb2.InfoRequest(), timeout=5)
    return out


def wait_idle(mesh: Mesh, timeout: float = 20.0) -> dict[str, worker_pb2.WorkerInfo]:
    """Wait until no worker holds a block for a live request (aborts settle asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        state = infos(mesh)
        busy = {n: (i.used_blocks, i.num_handoffs, i.num_running, i.num_waiting) for n, i in state.items()
                if i.used_blocks or i.num_handoffs or i.num_running or i.num_waiting}
        if not busy:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"workers still hold blocks: {busy}")
        time.sleep(0.1)


@pytest.fixture(scope="package")
def mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    # Prefill chunks of 64 tokens: long prompts take several steps, and their finished
    # blocks travel to the decode worker while later chunks compute.
    # Fixed core shares: these tests assert how routing spreads prompts over the two prefill
    # workers (a flood evicting a prefix on both), and lent cores would make one worker
    # measure cheaper than the other for a while. Lending has its own tests.
    spec = MeshSpec(model=str(llama_dir), prefill=2, decode=1, kvstore=1, worker_args=WORKER_ARGS, http_port=0,
                    prefill_args=["--max-num-batched-tokens", "64"], share_cores=False,
                    router_args=["--info-interval-s", "0.2"],
                    log_dir=str(tmp_path_factory.mktemp("mesh-logs")))
    with Mesh(spec) as m:
        yield m


@pytest.fixture()
def client(mesh: Mesh) -> Iterator[Client]:
    with Client(mesh.router_address, timeout=120) as c:
        yield c


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


def extra_router(mesh: Mesh, tmp_path: Path, *flags: str, prefill: list[str] | None = None
                 ) -> contextlib.AbstractContextManager[str]:
    """A second router in front of the mesh's workers (or the ``prefill`` ones given)."""
    prefills = prefill if prefill is not None else [p.address for p in mesh.prefill]
    return extra_process(tmp_path, "router2", [
        "router", "--model", mesh.spec.model, "--redis-url", mesh.redis_url, "--prefill", ",".join(prefills),
        "--decode", ",".join(p.address for p in mesh.decode), "--info-interval-s", "0.2", *flags])
