"""An engine that stops stepping while its process stays up (tests only).

A process stopped with SIGSTOP stops answering everything, pings included; an engine stuck
in a kernel (a GPU hang, a step that never ends) leaves the process answering ``Info``,
``Reserve`` and pings while no stream gets a token. That cannot be caused from outside, so
``PDMESH_FAULT_STEP_STALL=N:S`` makes the engine thread, after its ``N``-th step, wait
``S`` seconds once before the next (between steps: every other thread goes on as it
would). Read once when the engine starts; a warning is logged when it is on.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

STEP_STALL_ENV = "PDMESH_FAULT_STEP_STALL"


@dataclass
class StepStall:
    after_steps: int
    seconds: float
    steps: int = 0

    @classmethod
    def from_env(cls) -> StepStall | None:
        spec = os.environ.get(STEP_STALL_ENV)
        if not spec:
            return None
        after, seconds = spec.split(":")
        log.warning("FAULT INJECTION: the engine stops for %ss after step %s", seconds, after)
        return cls(int(after), float(seconds))

    def step_done(self) -> None:
        """Count a step; the ``after_steps``-th one is followed by the stall."""
        self.steps += 1
        if self.steps == self.after_steps:
            log.warning("FAULT INJECTION: the engine stops for %.1fs now", self.seconds)
            time.sleep(self.seconds)
