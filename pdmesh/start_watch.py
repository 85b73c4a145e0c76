"""Following the processes of a mesh from their start until they serve.

Each process gets ``start_timeout_s``, plus ``BUILD_WAIT_S`` once it shows (its build mark,
``attention/build_lock.py``) that it compiles pdmesh's CPU kernels or waits for another
process's compile; while it starts, the phase it writes (``pdmesh/startup.py``) goes to
``progress`` when it changes, at most every ``PROGRESS_S``. A process that exits, or is
not ready in time, ends the wait with a ``StartError`` carrying its log's last lines.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pdmesh.attention.build_lock import BUILD_WAIT_S
from pdmesh.errors import StartError
from pdmesh.rpc.health import is_serving
from pdmesh.rpc.tls import TLSFiles
from pdmesh.startup import read_phase


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    address: str = ""
    log: Path | None = None
    metrics_address: str = ""
    """host:port of its Prometheus /metrics."""
    args: list[str] = field(default_factory=list)
    """The ``pdmesh`` command line it was started with (to restart it the same way)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables set for it beyond the launcher's own (its GPU), kept for restarts."""

    @property
    def gpu(self) -> str | None:
        """The ``CUDA_VISIBLE_DEVICES`` it was given (None: the launcher's environment)."""
        return self.env.get("CUDA_VISIBLE_DEVICES")


PROGRESS_S = 5.0
"""The most often one starting process's phase is reported."""


@dataclass
class _Wait:
    """One process's start, as ``StartWatch.wait`` follows it."""

    start: float
    allowance: float
    building: bool = False
    shown: str = ""
    shown_at: float = -PROGRESS_S


class StartWatch:
    def __init__(self, log_dir: Path, tls: TLSFiles | None, start_timeout_s: float,
                 progress: Callable[[str], None] | None = None) -> None:
        self.log_dir = log_dir
        self.tls = tls
        self.start_timeout_s = start_timeout_s
        self.progress = progress
        """Told each starting process's phase (``pdmesh up`` prints it); None: silent."""

    def build_mark(self, name: str) -> Path:
        """The file a process shows while it builds pdmesh's CPU kernels (``build_lock.py``)."""
        return self.log_dir / f"{name}.building"

    def phase_file(self, name: str) -> Path:
        """Where a process writes its start-up phase (``pdmesh/startup.py``)."""
        return self.log_dir / f"{name}.phase"

    def wait(self, procs: list[Proc]) -> None:
        """Until every one of ``procs`` serves, each within its allowance from this call."""
        waits = {p.name: _Wait(time.monotonic(), self.start_timeout_s) for p in procs}
        pending = list(procs)
        while pending:
            for proc in list(pending):
                if self._ready(proc, waits[proc.name]):
                    pending.remove(proc)
            if pending:
                time.sleep(0.1)

    def _ready(self, proc: Proc, wait: _Wait) -> bool:
        port_file, now = self.log_dir / f"{proc.name}.port", time.monotonic()
        if not wait.building and self.build_mark(proc.name).exists():
            wait.allowance, wait.building = wait.allowance + BUILD_WAIT_S, True
        if proc.popen.poll() is not None:
            raise StartError(f"{proc.name} exited ({proc.popen.returncode}); log:\n{tail_log(proc.log)}")
        if port_file.is_file() and not proc.address:
            proc.address = f"127.0.0.1:{port_file.read_text().strip()}"
        if proc.address and is_serving(proc.address, self.tls):
            metrics_file = Path(str(port_file) + ".metrics")
            if metrics_file.is_file():
                proc.metrics_address = f"127.0.0.1:{metrics_file.read_text().strip()}"
            return True
        phase = read_phase(self.phase_file(proc.name))
        if self.progress is not None and phase and phase != wait.shown and now - wait.shown_at >= PROGRESS_S:
            self.progress(f"{proc.name}: {phase} ({now - wait.start:.0f}s)")
            wait.shown, wait.shown_at = phase, now
        if now > wait.start + wait.allowance:
            why = " (it was building pdmesh's CPU kernels, or waiting for another process's build)" \
                if wait.building else ""
            last = f", last phase: {phase}" if phase else ""
            raise StartError(f"{proc.name} not ready after {wait.allowance:g}s{why}{last}; log:\n{tail_log(proc.log)}")
        return False


def tail_log(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
