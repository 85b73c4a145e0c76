"""``pdmesh up``'s supervision: a SIGKILLed worker, router or Redis comes back on its port
and the mesh serves again."""

from __future__ import annotations

import time
from pathlib import Path

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


def _serves(address: str, want: list[int] | None = None) -> list[int]:
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(address, timeout=30) as c:
                out = c.complete(list(range(5, 40)), max_tokens=6, temperature=0).token_ids
            assert want is None or out == want
            return out
        except Exception:
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
            _serves(mesh.router_address, want)
        assert sup.restarts == {"decode-0": 1, "redis": 1, "router": 1}
