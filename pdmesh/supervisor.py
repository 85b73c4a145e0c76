"""Keep a local mesh alive: restart any process of it that dies, with back-off, logged.

``pdmesh up`` calls ``check`` about once a second. A dead process (worker, kvstore,
router or Redis) is started again on the same port, so the router and the workers find
it where it was; restarts of one process back off exponentially (1 s, 2 s, 4 s ... 60 s)
so a process that cannot start does not spin the machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pdmesh.launcher import Mesh

log = logging.getLogger(__name__)


@dataclass
class Supervisor:
    mesh: Mesh
    max_backoff_s: float = 60.0
    restarts: dict[str, int] = field(default_factory=dict)
    """Restarts so far, by process name."""
    _not_before: dict[str, float] = field(default_factory=dict)

    def check(self) -> list[str]:
        """Restart what died; returns one line per restart (or failed attempt)."""
        events = []
        now = time.monotonic()
        for proc in self.mesh.processes():
            code = proc.popen.poll()
            if code is None or now < self._not_before.get(proc.name, 0.0):
                continue
            n = self.restarts.get(proc.name, 0)
            self._not_before[proc.name] = now + min(self.max_backoff_s, 2.0**n)
            self.restarts[proc.name] = n + 1
            try:
                self.mesh.respawn(proc)
                events.append(f"{proc.name} exited ({code}); restarted on {proc.address} (restart {n + 1})")
            except (RuntimeError, OSError) as exc:
                events.append(f"{proc.name} exited ({code}); restart {n + 1} failed: {exc}")
        for line in events:
            log.warning("%s", line)
        return events
