"""``build_on_passing_thread``: the result or the error comes back, and the OpenMP pool the
build created is gone with its thread (a pool left behind slows every later parallel
region of the process: ``pdmesh/engine/compute_thread.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from pdmesh.engine.compute_thread import build_on_passing_thread


def test_returns_the_result_built_on_another_thread() -> None:
    here = threading.get_ident()
    built_on = build_on_passing_thread(threading.get_ident)
    assert built_on != here


def test_raises_the_builds_error_here() -> None:
    def fail() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        build_on_passing_thread(fail)


# In a fresh interpreter: pytest's own thread may already own a pool. Pool threads are
# counted as the process's OS threads; they leave asynchronously. torch starts one thread
# of its own (not OpenMP's) on the first parallel region anywhere: a first build makes it.
_POOLS = textwrap.dedent("""
    import os, time, torch
    from pdmesh.engine.compute_thread import build_on_passing_thread

    def tasks():
        return len(os.listdir("/proc/self/task"))

    def settle(want, deadline_s=10.0):
        end = time.monotonic() + deadline_s
        while tasks() != want and time.monotonic() < end:
            time.sleep(0.01)
        return tasks()

    def parallel_work():
        torch.set_num_threads(2)
        return float(torch.ones(4_000_000).mul(2).sum())

    build_on_passing_thread(parallel_work)
    time.sleep(1.0)  # that build's own pool thread leaves
    before = tasks()
    assert build_on_passing_thread(parallel_work) == 8_000_000.0
    after_passing = settle(before)
    parallel_work()  # the same work on this thread, which stays: its pool stays too
    after_here = settle(before + 1)
    print(before, after_passing, after_here)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")
def test_the_builds_openmp_pool_leaves_with_its_thread() -> None:
    out = subprocess.run([sys.executable, "-c", _POOLS], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    before, after_passing, after_here = map(int, out.stdout.split())
    assert after_passing == before, "the passing thread's OpenMP pool outlived it"
    assert after_here == before + 1, "the check cannot see a pool (one worker thread expected)"
