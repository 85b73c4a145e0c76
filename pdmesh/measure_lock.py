"""One start-up measurement at a time on a machine (torch-free).

Engines time their linear products when they load (``model/linear_plan.py``) and keep the
fastest for the process's life. Workers that ``pdmesh up`` starts together used to
measure at once: on a 2-core machine two processes of two OpenMP threads each timed a pass
over the default model's weights at 310-324 ms where it takes 5-6 ms alone, the probe
took 21 s instead of 1.5, and each worker kept whatever plan those figures gave
(docs/performance/log.md, section 28). A file lock in the machine's temporary folder makes
them take turns; a wait past its deadline measures anyway and says so. A worker's
warm-up (``engine/warm_up.py``), not a measurement but a second of work on every core it
has, holds the same lock shared (``not_while_measuring``): never beside another process's
probe, but beside other warm-ups (taking turns there made each extra worker start ~1.6 s
later on 2 cores, for nothing when they all reuse one plan).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "pdmesh-measure.lock"
"""In ``state_dir()``: one per machine, shared by every user's processes."""
STATE_DIR_ENV = "PDMESH_STATE_DIR"
"""Where the machine-wide files live (this lock, the plan store) instead of the temp folder:
a test run sets it to its own folder, so another process's lock or plans never reach it."""
WAIT_S = 120.0
"""A measurement takes seconds; a lock held longer than this is held by a stuck process."""
_POLL_S = 0.02


def state_dir() -> Path:
    """The folder of the files every pdmesh process on this machine shares."""
    return Path(os.environ.get(STATE_DIR_ENV) or tempfile.gettempdir())


@contextlib.contextmanager
def measuring_alone(what: str, timeout: float = WAIT_S, path: Path | None = None) -> Iterator[bool]:
    """Hold the machine's measurement lock while the block runs: True once held; False
    when another process held it past ``timeout`` (logged: the block then measures
    beside it) or when the lock file cannot be opened at all."""
    with _holding(what, fcntl.LOCK_EX, timeout, path) as held:
        yield held


@contextlib.contextmanager
def not_while_measuring(what: str, timeout: float = WAIT_S, path: Path | None = None) -> Iterator[bool]:
    """Hold the lock shared while the block runs: it waits for a measurement in progress
    and keeps new ones out until it ends, but runs beside other shared holders. True and
    False as for ``measuring_alone``."""
    with _holding(what, fcntl.LOCK_SH, timeout, path) as held:
        yield held


@contextlib.contextmanager
def _holding(what: str, mode: int, timeout: float, path: Path | None) -> Iterator[bool]:
    path = path or state_dir() / LOCK_FILE
    try:
        fd = _open(path)
    except OSError as exc:
        log.warning("cannot open %s (%s): %s goes ahead without waiting for other processes", path, exc, what)
        yield False
        return
    held = False
    try:
        since = time.monotonic()
        while not held:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() - since > timeout:
                    log.warning("another process has held %s for %.0fs: %s goes ahead beside it, and "
                                "figures measured meanwhile may be off", path, timeout, what)
                    break
                time.sleep(_POLL_S)
        if held and time.monotonic() - since > 1.0:
            log.info("%s waited %.1fs for another process's measurement or warm-up to end", what,
                     time.monotonic() - since)
        yield held
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's file: a read-only descriptor locks as well
        return os.open(path, os.O_RDONLY)
