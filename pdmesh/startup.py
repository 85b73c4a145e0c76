"""What a starting process is doing, for whoever waits on it.

A worker's start can take minutes (weights, a first kernel build, the linear plan, the KV
pool's first touch, the warm-up), and a silent wait reads as a hang. Each step calls
``set_phase``; the phase is logged, answered by the readiness gate to calls that arrive
too early (``pdmesh/rpc/readiness.py``), and written to ``$PDMESH_PHASE_FILE`` when a
launcher set it, which ``pdmesh up`` shows while it waits (``pdmesh/launcher.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PHASE_FILE_ENV = "PDMESH_PHASE_FILE"
"""Set per process by the launcher: where the current phase is written."""

_lock = threading.Lock()
_phase = "starting"
_since = time.monotonic()


def set_phase(phase: str) -> None:
    """Say what this process does now (``"loading weights 2/4 shards"``)."""
    global _phase, _since
    with _lock:
        if phase == _phase:
            return
        _phase, _since = phase, time.monotonic()
    log.info("start-up: %s", phase)
    path = os.environ.get(PHASE_FILE_ENV)
    if path:
        tmp = Path(path + ".tmp")
        try:
            tmp.write_text(phase)
            tmp.replace(path)
        except OSError:  # the launcher's folder is gone: nobody is watching
            pass


def current_phase() -> tuple[str, float]:
    """The phase and how many seconds it has lasted."""
    with _lock:
        return _phase, time.monotonic() - _since


def read_phase(path: Path) -> str:
    """A process's phase as its launcher reads it ("" before the first)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""
