"""The C++ kernels run without the GIL: a worker's event loop (gRPC messages, streamed
tokens) and its NIXL poller thread must not stall for the length of an attention or linear
kernel on the engine thread (docs/performance.md section 15)."""

from __future__ import annotations

import threading
import time

import torch

from pdmesh.attention.cpu_kernels import load

KERNELS = load()


def _longest_gap_while(work) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Run ``work`` on a thread; meanwhile this thread runs Python and records the longest
    time it went without running. Returns ``(longest gap, work's own seconds)``."""
    done = threading.Event()
    took = [0.0]

    def run() -> None:
        t0 = time.perf_counter()
        work()
        took[0] = time.perf_counter() - t0
        done.set()

    thread = threading.Thread(target=run)
    last = time.perf_counter()
    longest = 0.0
    thread.start()
    while not done.is_set():
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    thread.join()
    return longest, took[0]


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

        gap, took = _longest_gap_while(work)
    finally:
        torch.set_num_threads(threads)
    per_call = took / 8
    # Holding the GIL, this thread would wait out whole calls (and Python's 5 ms switch
    # interval); released, it waits only for the scheduler.
    assert per_call > 0.005, f"the input is too small to tell ({1000 * per_call:.1f} ms per call)"
    assert gap < per_call / 2, f"a Python thread stalled {1000 * gap:.1f} ms during {1000 * per_call:.1f} ms calls"
