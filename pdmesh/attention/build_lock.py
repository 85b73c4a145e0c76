"""One kernel build at a time per build folder, and none waiting on a build that died.

torch's cpp_extension guards a build folder with a lock file it creates and deletes
itself, and waits for it without a deadline. A build killed midway (``pdmesh up`` stopped
with Ctrl-C during its first start, which builds for minutes on two cores) leaves that
file behind, and every later start waited on it; the worker then missed its start
deadline with nothing in its log to say why. pdmesh's builds first take an advisory
``flock`` on a file of their own in the same folder. The kernel drops a ``flock`` when its
holder dies, however it dies, so whoever holds ours knows that no pdmesh build is running:
a torch lock file found then was left by a dead build and is removed at once. (A build of
the same sources by a pdmesh older than this module takes no ``flock``; two such builds at
once are not guarded against.)"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pdmesh.errors import PdmeshError

log = logging.getLogger(__name__)

BUILD_MARK_ENV = "PDMESH_KERNEL_BUILD_MARK"
"""A file a process creates while it compiles the kernels or waits for another's build,
and removes after: ``pdmesh up`` sets it per worker and gives a worker that shows it
``BUILD_WAIT_S`` more to start, since a first build takes minutes on two cores and would
otherwise miss the start deadline as a worker that hung."""
BUILD_WAIT_S = 900.0
"""How long to wait for another process's build (about three minutes on our 2-core
machines, longer while tests run beside it)."""
OWN_LOCK = "pdmesh-build.lock"
TORCH_LOCK = "lock"


class BuildLockTimeoutError(PdmeshError):
    """Another process held the build folder for longer than any build takes."""


@contextlib.contextmanager
def build_lock(build_dir: Path, wait_s: float = BUILD_WAIT_S, poll_s: float = 0.5,
               on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``build_dir`` for one build: wait (at most ``wait_s``) while another live
    process builds there, then remove a torch lock file that no live build holds.
    ``on_wait`` is told the holder's pid once, when a wait begins."""
    build_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(build_dir / OWN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if _acquire(fd, build_dir, wait_s, poll_s, on_wait):
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())  # read by the next waiter's log line
            stale = build_dir / TORCH_LOCK
            if stale.exists():
                log.warning("removing %s: a kernel build that did not finish left it (no process builds here "
                            "now)", stale)
                stale.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # drops the flock


def _acquire(fd: int, build_dir: Path, wait_s: float, poll_s: float,
             on_wait: Callable[[str], None] | None = None) -> bool:
    """True once the flock is held; False where the filesystem refuses flock (some network
    mounts), after a warning: the build then runs under torch's lock alone."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as exc:
            log.warning("%s takes no flock (%s): building under torch's own lock only, which a killed build "
                        "can leave behind", build_dir, exc)
            return False
        if not told:
            holder = (build_dir / OWN_LOCK).read_text().strip() or "?"
            log.info("waiting for process %s's kernel build in %s (at most %.0f s)", holder, build_dir, wait_s)
            if on_wait is not None:
                on_wait(holder)
            told = True
        if time.monotonic() > deadline:
            raise BuildLockTimeoutError(f"another process has held the kernel build folder {build_dir} for "
                                        f"over {wait_s:.0f} s; if no build runs, remove {build_dir}")
        time.sleep(poll_s)


class BuildMark:
    """``$PDMESH_KERNEL_BUILD_MARK``, shown (the file exists) from ``show`` to the end of
    the ``with`` block: while this process compiles, or waits for another's compile.
    Nothing when the variable is unset (a process no launcher waits on)."""

    def __init__(self) -> None:
        self.path = os.environ.get(BUILD_MARK_ENV, "")

    def show(self) -> None:
        if self.path:
            Path(self.path).touch()

    def __enter__(self) -> BuildMark:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.path:
            Path(self.path).unlink(missing_ok=True)
