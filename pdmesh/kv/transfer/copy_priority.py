"""Run a KV copy at real-time priority while it lasts.

Between processes on one host NIXL's UCX backend copies a write's blocks inside the
``transfer`` call (``cma``: the kernel copies from the writer's memory into the reader's),
on the thread that starts it: a prefill worker's event loop. Under load that thread shares
the cores with the engines' OpenMP threads, which take every cycle they are given, and the
scheduler preempts the copy once or twice mid-way: on 2 cores a 4 MiB write used 0.75-1.0
ms of CPU and took 1.5-6 ms, so the mesh wrote KV at 0.25-0.34x of raw NIXL rewriting the
same blocks and 0.47-0.65x of raw NIXL into fresh blocks (docs/performance/log.md §32). Lower
niceness, a longer EEVDF slice and pinning did not keep the copy on its core (§19, §32).

``SCHED_FIFO`` does: a real-time thread is not preempted by threads of the normal classes,
so the copy runs to its end as soon as it starts and the engines' threads wait the ~1 ms it
costs, the same CPU either way. ``TransferRunner`` raises the thread for a transfer's start
and its first poll (which sees such a write DONE), then puts it back to the policy and
priority it had (its nice value kept); nothing else in the process runs at real-time
priority. The kernel's real-time throttling (95% of each second by default)
still bounds what one could take if a call ever spun.

Raising a thread needs ``CAP_SYS_NICE`` or an ``RLIMIT_RTPRIO`` of at least 1 (``ulimit
-r 1``; Docker: ``--cap-add SYS_NICE``), and a cgroup that grants real-time time where
real-time group scheduling is on. ``copy_priority`` probes once per process; where it is
refused the copies run at the thread's own priority and the worker logs why at start-up.

Torch-free, Linux only (elsewhere there is no ``sched_setscheduler``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

Priority = Literal["realtime", "normal"]
RT_PRIORITY = 1
"""The lowest real-time priority: above every normal thread, below any real-time thread
the host runs for itself (interrupt threads, watchdogs)."""


@functools.cache
def realtime_refusal() -> str:
    """Why this process may not raise a thread to ``SCHED_FIFO`` ("" when it may): tried
    once on the calling thread and put back."""
    if not hasattr(os, "sched_setscheduler"):
        return "this platform has no sched_setscheduler"
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    except OSError as exc:
        return (f"SCHED_FIFO refused ({exc.strerror}): grant CAP_SYS_NICE (Docker: --cap-add SYS_NICE) "
                f"or an RLIMIT_RTPRIO of at least {RT_PRIORITY} (ulimit -r {RT_PRIORITY})")
    os.sched_setscheduler(0, policy, param)
    return ""


@dataclass
class CopyPriority:
    """How a transport's copies run: ``call(fn, ...)`` runs ``fn`` at real-time priority
    when ``realtime``, else as it is."""

    realtime: bool
    detail: str
    """One line for the start-up log."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, fn: Callable[..., T], *args: object) -> T:
        if not self.realtime:
            return fn(*args)
        policy = os.sched_getscheduler(0)
        if policy in (os.SCHED_FIFO, os.SCHED_RR):  # already real-time: the operator's choice
            return fn(*args)
        param = os.sched_getparam(0)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        except OSError as exc:  # allowed at start-up, refused now (a cgroup or limit changed)
            self._refused(exc)
            return fn(*args)
        try:
            return fn(*args)
        finally:
            os.sched_setscheduler(0, policy, param)

    def _refused(self, exc: OSError) -> None:
        with self._lock:
            if self.realtime:
                self.realtime = False
                self.detail = f"KV copies at the thread's own priority: SCHED_FIFO refused since start-up ({exc})"
                log.warning(self.detail)



def copy_priority(requested: Priority) -> CopyPriority:
    """The priority a transport's copies run at, as asked where this process may."""
    if requested == "normal":
        return CopyPriority(False, "KV copies at the thread's own priority (kv_copy_priority normal)")
    refusal = realtime_refusal()
    if refusal:
        return CopyPriority(False, f"KV copies at the thread's own priority: {refusal}; under load a "
                                   "copy is preempted by the engines' threads and takes longer")
    return CopyPriority(True, f"KV copies at real-time priority while they run (SCHED_FIFO {RT_PRIORITY})")

