"""One line per engine step, when ``PDMESH_STEP_LOG`` names a file: what the step ran and
how long its forward pass took. Each process writes ``FILE.PID``: a mesh's workers inherit
the variable, and one shared file interleaved their lines with nothing to tell them apart.

A served worker schedules differently from the same engine driven in process (requests
arrive over milliseconds, a step starts before the rest of a burst has come), and the
gap between the two is invisible in throughput alone. The log answers it: per step, its
start (monotonic seconds), the forward pass's seconds, the prompt tokens and the decode
rows it ran, the sequences waiting behind it, the threads it ran on (a worker that
splits the machine's cores borrows idle peers' shares: ``core_share.py``), and the CPU
seconds the engine thread itself spent in the forward pass (short of the wall time when the
thread was preempted or slept: on a step of one thread, what other processes took from its
core). Tab-separated, appended, a line at a time (one ``write`` of ~50 bytes per step of
milliseconds: nothing lost when a worker is killed).
"""

from __future__ import annotations

import os
import time
from typing import IO

import torch

from pdmesh.engine.scheduler import SchedulerOutput

ENV = "PDMESH_STEP_LOG"


class StepLog:
    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the engine
        self._file.write(f"# pid {os.getpid()}\tstart_s\tforward_s\tprompt_tokens\tdecode_rows\twaiting"
                         "\tthreads\tthread_cpu_s\n")

    @classmethod
    def from_env(cls) -> StepLog | None:
        path = os.environ.get(ENV, "")
        return cls(f"{path}.{os.getpid()}") if path else None

    def record(self, sched: SchedulerOutput, prompt_tokens: int, seconds: float, cpu_seconds: float,
               waiting: int) -> None:
        """A step whose forward pass just ended, ``seconds`` after it started, having used
        ``cpu_seconds`` of the engine thread's CPU time."""
        decode_rows = sum(1 for s in sched.scheduled if s.num_new_tokens == 1)
        self._file.write(f"{time.monotonic() - seconds:.6f}\t{seconds:.6f}\t{prompt_tokens}\t{decode_rows}"
                         f"\t{waiting}\t{torch.get_num_threads()}\t{cpu_seconds:.6f}\n")

    def close(self) -> None:
        self._file.close()
