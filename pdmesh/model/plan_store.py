"""Linear plans shared by the processes of one machine for a while (torch-free).

A plan one process measured (``linear_plan.choose``) is taken by the others that load
weights of the same shapes on the same threads within ``REUSE_S``. Each process used to
measure its own, and ranges whose products are near ties went either way: on a 2-core
Intel Xeon a worker whose plan computed 64-256 rows by oneDNN's product ran a lone
256-token prompt 8-15 ms (10-15%) faster than one whose plan took MKL's, for their whole
lives (docs/performance/log.md, section 28). With the plan shared, the workers of one mesh
compute at one pace, and all but the first start ~1.5 s sooner. Past ``REUSE_S`` a process
measures again: what else runs on a machine changes. Read and written under the
measurement lock (``pdmesh.measure_lock``); a file that cannot be read or written costs a
measurement, never a start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pdmesh.measure_lock import state_dir

log = logging.getLogger(__name__)

STORE_FILE = "pdmesh-linear-plans.json"
"""In ``measure_lock.state_dir()``, beside the measurement lock."""
REUSE_S = 600.0
"""A plan is taken as it is for ten minutes after it was measured: long enough for a mesh
to start and restart its workers, short enough that a machine whose load has changed is
measured again."""


@dataclass(frozen=True, slots=True)
class Stored:
    products: tuple[str, ...]
    """``Product`` values, one per range."""
    age_s: float
    pid: int
    """The process that measured it."""


def _path() -> Path:
    return state_dir() / STORE_FILE


def load(key: str, path: Path | None = None, now: float | None = None) -> Stored | None:
    """The plan stored under ``key`` if it is younger than ``REUSE_S``."""
    entry = _read(path or _path()).get(key)
    return _young(entry, time.time() if now is None else now)


def save(key: str, products: tuple[str, ...], path: Path | None = None, now: float | None = None) -> None:
    """Store ``products`` under ``key`` (entries past ``REUSE_S``, or unreadable, are dropped
    on the way)."""
    path = path or _path()
    at = time.time() if now is None else now
    entries = {k: v for k, v in _read(path).items() if _young(v, at) is not None}
    entries[key] = {"products": list(products), "at": at, "pid": os.getpid()}
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".pdmesh-plans-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f)
        os.chmod(tmp, 0o666)
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except OSError as exc:
        log.warning("cannot store the linear plan in %s (%s): the next process measures its own", path, exc)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _young(entry: object, now: float) -> Stored | None:
    """``entry`` as stored, if it is younger than ``REUSE_S``; None for an old one or one
    not in this module's form (another version's, or damaged: then measured again)."""
    if not isinstance(entry, dict):
        return None
    try:
        age = now - float(entry.get("at", 0.0))
        products = entry.get("products", ())
        if not isinstance(products, list | tuple) or not all(isinstance(p, str) for p in products):
            return None
        stored = Stored(tuple(products), age, int(entry.get("pid", 0)))
    except (TypeError, ValueError):
        return None
    return stored if 0 <= age < REUSE_S else None


def _read(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("cannot read the stored linear plans in %s (%s): measuring instead", path, exc)
        return {}
    return data if isinstance(data, dict) else {}
