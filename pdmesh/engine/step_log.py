"""One line per engine step, when ``PDMESH_STEP_LOG`` names a file: what the step ran and
how long its forward pass took. Each process writes ``FILE.PID``: a mesh's workers inherit
the variable, and one shared file interleaved their lines with nothing to tell them apart.

A served worker schedules differently from the same engine driven in process (requests
arrive over milliseconds, a step starts before the rest of a burst has come), and the
gap between the two is invisible in throughput alone. The log answers it: per step, its
start (monotonic seconds), the forward pass's seconds, the prompt tokens and the decode
rows it ran, the sequences waiting behind it, the threads it ran on (a worker that
splits the machine's cores borrows idle peers' shares: ``core_share.py``), and what the
engine thread itself went through in the forward pass: its CPU seconds (short of the wall
time when the thread was preempted or slept: on a step of one thread, what other processes
took from its core), its minor page faults (memory touched for the first time: a fresh
worker's first large steps took thousands, docs/performance/log.md §29) and the times it was
preempted. Tab-separated, appended, a line at a time (one ``write`` of ~60 bytes per step
of milliseconds: nothing lost when a worker is killed).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch

from pdmesh.engine.scheduler import SchedulerOutput

ENV = "PDMESH_STEP_LOG"
_WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
"""The engine thread's own counts where the platform has them (Linux), else the process's."""


@dataclass(frozen=True, slots=True)
class ThreadUsage:
    cpu_s: float
    minor_faults: int
    preempted: int

    @classmethod
    def now(cls) -> ThreadUsage:
        ru = resource.getrusage(_WHO)
        return cls(time.thread_time(), ru.ru_minflt, ru.ru_nivcsw)


class StepLog:
    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the engine
        self._file.write(f"# pid {os.getpid()}\tstart_s\tforward_s\tprompt_tokens\tdecode_rows\twaiting"
                         "\tthreads\tthread_cpu_s\tminor_faults\tpreempted\n")

    @classmethod
    def from_env(cls) -> StepLog | None:
        path = os.environ.get(ENV, "")
        return cls(f"{path}.{os.getpid()}") if path else None

    def record(self, sched: SchedulerOutput, prompt_tokens: int, seconds: float, before: ThreadUsage,
               waiting: int) -> None:
        """A step whose forward pass just ended, ``seconds`` after it started, when the engine
        thread's usage was ``before``."""
        after = ThreadUsage.now()
        decode_rows = sum(1 for s in sched.scheduled if s.num_new_tokens == 1)
        self._file.write(f"{time.monotonic() - seconds:.6f}\t{seconds:.6f}\t{prompt_tokens}\t{decode_rows}"
                         f"\t{waiting}\t{torch.get_num_threads()}\t{after.cpu_s - before.cpu_s:.6f}"
                         f"\t{after.minor_faults - before.minor_faults}\t{after.preempted - before.preempted}\n")

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """A step as a log file has it (its first four columns)."""

    start_s: float
    forward_s: float
    prompt_tokens: int
    decode_rows: int


def read_steps(path: Path) -> list[LoggedStep]:
    """The steps of one log file (``FILE.PID``), in the order they ran."""
    steps = []
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            start, seconds, prompt_tokens, decode_rows = line.split("\t")[:4]
            steps.append(LoggedStep(float(start), float(seconds), int(prompt_tokens), int(decode_rows)))
    return steps
