"""One start-up measurement at a time on a machine (torch-free).

Engines time their linear products when they load (``model/linear_plan.py``) and keep the
fastest for the process's life. Workers that ``pdmesh up`` starts together used to
measure at once: on a 2-core machine two processes of two OpenMP threads each timed a pass
over the default model's weights at 310-324 ms where it takes 5-6 ms alone, the probe
took 21 s instead of 1.5, and each worker kept whatever plan those figures gave
(docs/performance.md, section 28). A file lock in the machine's temporary folder makes
them take turns; a wait past its deadline measures anyway and says so.
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
"""In ``tempfile.gettempdir()``: one per machine, shared by every user's processes."""
WAIT_S = 120.0
"""A measurement takes seconds; a lock held longer than this is held by a stuck process."""
_POLL_S = 0.02


@contextlib.contextmanager
def measuring_alone(what: str, timeout: float = WAIT_S, path: Path | None = None) -> Iterator[bool]:
    """Hold the machine's measurement lock while the block runs: True once held; False
    when another process held it past ``timeout`` (logged: the block then measures
    beside it) or when the lock file cannot be opened at all."""
    path = path or Path(tempfile.gettempdir()) / LOCK_FILE
    try:
        fd = _open(path)
    except OSError as exc:
        log.warning("cannot open %s (%s): %s measures without waiting for other processes", path, exc, what)
        yield False
        return
    held = False
    try:
        since = time.monotonic()
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() - since > timeout:
                    log.warning("another process has held %s for %.0fs: %s measures beside it, and its "
                                "figures may be off", path, timeout, what)
                    break
                time.sleep(_POLL_S)
        if held and time.monotonic() - since > 1.0:
            log.info("%s waited %.1fs for another process's measurement to end", what, time.monotonic() - since)
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
