"""Process-level helpers every service shares: port files, advertised addresses, deadlines.

Torch-free and engine-free, so the router and the kvstore can use them without loading
the model stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc

log = logging.getLogger(__name__)


def advertised(explicit: str, host: str, port: int) -> str:
    """The address other processes should dial to reach a server bound to host:port."""
    if explicit:
        return explicit
    if host in ("0.0.0.0", "::", "[::]", ""):
        return f"{socket.gethostname()}:{port}"
    return f"{host}:{port}"


def listen_socket(host: str, port: int, flag: str) -> socket.socket:
    """A TCP socket listening on host:port, or a ``BindError`` naming ``flag``. Servers that
    take a socket (uvicorn) get one bound here, so a taken port is one line naming the
    option rather than the server's own exit in the middle of start-up."""
    from pdmesh.errors import BindError

    bare = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise BindError.at(f"{host}:{port}", flag) from exc
    return sock


def check_port_free(host: str, port: int, flag: str) -> None:
    """Refuse a taken port before anything starts (``pdmesh up`` checks the router's
    ports before its workers spend minutes loading); 0 is always free."""
    if port:
        listen_socket(host, port, flag).close()


def write_port_file(path: str, port: int) -> None:
    """Atomically publish the bound port (launchers start services on port 0)."""
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(path)


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel background tasks and wait until each has finished unwinding."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def now_ms() -> int:
    """Wall-clock milliseconds: leases cross processes, so they use Unix time."""
    return int(time.time() * 1000)


def remaining(context: grpc.aio.ServicerContext, default: float) -> float:
    """Seconds left on the caller's deadline (``default`` when it set none)."""
    left = context.time_remaining()
    return default if left is None else max(0.0, left)


PARENT_ENV = "PDMESH_PARENT_PID"
"""Set by whoever starts a service process and wants it gone with them (``Mesh``)."""


def exit_with_parent(poll_s: float = 1.0) -> None:
    """With ``PDMESH_PARENT_PID`` set: drain and exit (SIGTERM to ourselves) once that
    process is gone. Services run in sessions of their own so a Ctrl-C reaches them only
    through the launcher's orderly stop; a launcher that is killed outright (SIGKILL, a
    test runner's timeout) would otherwise leave every worker serving forever, holding
    ports, memory and cores."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    parent_pid = int(parent)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="pdmesh-parent-watch", daemon=True).start()


_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)  # the launcher ended before the signal was set: nobody would stop this one
os.execvp(sys.argv[2], sys.argv[2:])
"""
"""Run as ``python -c`` in front of a child that is not ours: the death signal is set by the
child itself and kept across ``execvp``."""


def ends_with_this_thread(argv: list[str]) -> list[str]:
    """``argv`` for a child that is not ours (redis-server), started so that it gets SIGTERM
    when the thread starting it ends (Linux's PR_SET_PDEATHSIG): a launcher killed outright
    (SIGKILL, a test runner's timeout) then leaves no Redis behind, as our own services end
    by watching their parent (``exit_with_parent``). The child sets the signal itself, in a
    short Python trampoline before it execs ``argv``: setting it in the parent's fork
    (``preexec_fn``) makes ``subprocess`` fork() where it would vfork, which runs gRPC's
    fork handlers, and one of those hung a test run for good in ``fork()``. Only from the
    main thread, which lives as long as the process (from another, the child would die with
    that thread), and only on Linux; otherwise ``argv`` as it is, whose child then outlives a
    killed launcher."""
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def freeze_startup_objects() -> int:
    """Collect once, then move every object alive now out of the garbage collector's
    reach (``gc.freeze``); returns how many were frozen.

    A service holds hundreds of thousands of long-lived objects once it is up (torch,
    the model's modules, protobuf descriptors, FastAPI's routes), and every full
    collection walked them all while each of the process's threads waited: measured in a
    served decode worker, 81-91 ms per full collection, about one per 3-4 s benchmark run
    under load, and 25-55 ms in the router (docs/performance/log.md, section 16). What is frozen is never
    freed, which is what a service's start-up state is for; what requests allocate later
    is collected as before. vLLM freezes its start-up objects the same way.
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


T = TypeVar("T")

LOOP_ENV = "PDMESH_EVENT_LOOP"
"""``uvloop`` (the default) or ``asyncio``: the event loop a service runs on."""


def run_service_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine to completion on its event loop (logged), and return
    what it returns (the routing simulator runs the router's code on the router's loop).

    uvloop by default: a service's event loop relays every streamed token (gRPC in and
    out, SSE), and on uvloop the router spent 0.27-0.29 s of CPU on the shared-prefix
    benchmark against 0.40-0.48 s on asyncio's own loop, which on a machine whose cores
    the engines fill is time taken from them (docs/performance/log.md, section 16). gRPC's
    asyncio API runs on any asyncio loop. ``PDMESH_EVENT_LOOP=asyncio`` keeps the
    standard loop; any other value is an error, not a fallback.
    """
    choice = os.environ.get(LOOP_ENV, "uvloop") or "uvloop"
    if choice in ("asyncio", "uvloop"):
        log.info("event loop: %s (%s)", choice, LOOP_ENV)
    if choice == "asyncio":
        return asyncio.run(main)
    if choice == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    main.close()
    from pdmesh.errors import PdmeshError

    raise PdmeshError(f"{LOOP_ENV}={choice!r}: use 'uvloop' (the default) or 'asyncio'")
