"""The C++ kernels run without the GIL: a worker's event loop (gRPC messages, streamed
tokens) and its NIXL poller thread must not stall for the length of an attention or linear
kernel on the engine thread (docs/performance/log.md section 15)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import torch

from pdmesh.attention.cpu_kernels import load

KERNELS = load()
TICK_S = 0.0005
WORK_DEADLINE_S = 60.0
"""The work measured takes well under a second; still running after this, it is stuck."""


def _longest_gap_while(work: Callable[[], None]) -> tuple[float, float]:
    """Run ``work`` on a thread; meanwhile this thread wakes every ``TICK_S`` and records the
    longest time between its wake-ups. Returns ``(longest gap, work's own seconds)``.

    The observer sleeps rather than spins: a waking thread needs the GIL but little CPU
    share, so on a loaded 2-core machine its gaps measure the GIL, not the scheduler."""
    done = threading.Event()
    took = [0.0]

    def run() -> None:
        t0 = time.perf_counter()
        work()
        took[0] = time.perf_counter() - t0
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    last = time.perf_counter()
    deadline = last + WORK_DEADLINE_S
    longest = 0.0
    thread.start()
    while not done.is_set():
        time.sleep(TICK_S)
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
        assert now < deadline, f"the work measured was still running after {WORK_DEADLINE_S:.0f}s"
    thread.join(WORK_DEADLINE_S)
    return longest, took[0]


def _stall_share(work: Callable[[], None], calls: int) -> tuple[float, float]:
    """``(longest stall / one call's seconds, one call's seconds)``, the best of three tries.

    Holding the GIL makes every try stall for whole calls, so noise (another process, a
    descheduled vCPU) can only raise a try's share: the least of three cannot hide a held
    GIL, and one unlucky try cannot fail a kernel that releases it."""
    tries = []
    for _ in range(3):
        gap, took = _longest_gap_while(work)
        per_call = took / calls
        tries.append((gap / per_call, per_call))
        if tries[-1][0] < 0.5:
            break
    return min(tries)


def test_a_long_kernel_call_lets_other_python_threads_run() -> None:
    torch.manual_seed(0)
    x = torch.randn(4096, 4096)  # 64 MiB: one call takes tens of milliseconds
    weight = torch.randn(4096)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel on one core, this thread on another (or sharing)
    try:
        def work() -> None:
            for _ in range(8):
                KERNELS.rms_norm(x, weight, 1e-6)

        share, per_call = _stall_share(work, calls=8)
    finally:
        torch.set_num_threads(threads)
    assert per_call > 0.005, f"the input is too small to tell ({1000 * per_call:.1f} ms per call)"
    assert share < 0.5, f"a Python thread stalled {100 * share:.0f}% of a {1000 * per_call:.1f} ms call"


def test_the_measure_sees_a_call_that_holds_the_gil() -> None:
    """The control: sorting a list of ints is C code that never lets the GIL go, and the
    observer must see it stall for most of the call."""
    values = list(range(400_000))
    random.Random(0).shuffle(values)

    def work() -> None:
        for _ in range(2):
            sorted(values)

    gap, took = _longest_gap_while(work)
    per_call = took / 2
    assert per_call > 0.005, f"the control is too small to tell ({1000 * per_call:.1f} ms per call)"
    assert gap > 0.8 * per_call, f"held GIL unseen: {1000 * gap:.1f} ms stall in {1000 * per_call:.1f} ms calls"
