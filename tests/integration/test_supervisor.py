"""``pdmesh up``'s supervision: a SIGKILLed worker, router or Redis comes back on its port
and the mesh serves again."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from pdmesh.supervisor import Supervisor


def _until_restarted(sup: Supervisor, name: str, timeout: float = 120.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = sup.check()
        if any(e.startswith(name) for e in events):
            return events
        time.sleep(0.2)
    raise AssertionError(f"{name} was not restarted")


def _serves(address: str) -> list[int]:
    """The mesh's greedy answer, once it answers: only a refused or broken call is retried
    (the mesh is coming back); the tokens are the caller's to check."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(address, timeout=30) as c:
                return c.complete(list(range(5, 40)), max_tokens=6, temperature=0).token_ids
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_dead_processes_come_back_and_the_mesh_serves(llama_dir: Path, tmp_path: Path) -> None:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, worker_args=["--dtype", "float32", "--num-blocks", "128"],
                    router_args=["--info-interval-s", "0.2"], log_dir=str(tmp_path / "logs"))
    with Mesh(spec) as mesh:
        sup = Supervisor(mesh)
        want = _serves(mesh.router_address)
        for proc in (mesh.decode[0], mesh.redis, mesh.router):
            assert proc is not None
            address = proc.address
            proc.popen.kill()
            proc.popen.wait(10)
            events = _until_restarted(sup, proc.name)
            assert "restarted on" in events[0] and proc.address == address, events
            assert _serves(mesh.router_address) == want, proc.name
        assert sup.restarts == {"decode-0": 1, "redis": 1, "router": 1}


def test_services_exit_when_their_launcher_is_killed(llama_dir: Path, tmp_path: Path) -> None:
    """A launcher killed outright (SIGKILL: no stop, no finally) leaves no service serving:
    each notices its parent is gone and drains itself."""
    import os
    import signal
    import subprocess
    import sys

    pids = tmp_path / "pids"
    script = f"""
import time
from pdmesh.launcher import Mesh, MeshSpec
m = Mesh(MeshSpec(model={str(llama_dir)!r}, prefill=0, decode=1, kvstore=0, log_dir={str(tmp_path / 'logs')!r},
                  worker_args=["--dtype", "float32", "--num-blocks", "64"])).start()
open({str(pids)!r}, "w").write(" ".join(str(p.popen.pid) for p in [*m.decode, m.router, m.redis]))
time.sleep(600)
"""
    launcher = subprocess.Popen([sys.executable, "-c", script])
    started: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not pids.is_file() or not pids.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline, "the mesh did not start"
            time.sleep(0.2)
        started = [int(p) for p in pids.read_text().split()]
        *services, redis = started
        launcher.send_signal(signal.SIGKILL)
        # Its private redis-server cannot watch for that (not a pdmesh process): ours to stop.
        os.kill(redis, signal.SIGTERM)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 60
        alive = services
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in services if _running(p)]
        assert not alive, f"still serving after their launcher died: {alive}"
    finally:  # leave nothing behind, whichever assertion fails
        launcher.kill()
        launcher.wait(10)
        for p in started:
            if _running(p):
                os.kill(p, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (an exited child of a dead parent is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
