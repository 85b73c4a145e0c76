"""A child that is not ours, started through ``ends_with_this_thread``, gets SIGTERM when
the process that started it is killed outright, without ``preexec_fn`` (which makes
``subprocess`` fork() and run gRPC's fork handlers, one of which hung a test run in fork())."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAUNCHER = """
import subprocess, sys, time
import grpc  # loaded, as in a launcher or a test that talks to its mesh
from pdmesh.rpc.process import ends_with_this_thread
child = subprocess.Popen(ends_with_this_thread(["sleep", "60"]))
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper counts as gone
        return f.read().split()[2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_ends_when_its_launcher_is_killed() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        child = int(launcher.stdout.readline())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the trampoline execs the child under the same pid
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] == b"sleep":
                    break
            time.sleep(0.02)
        else:
            pytest.fail("the trampoline did not exec its child")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(child), "the child outlived its killed launcher"
    finally:
        launcher.kill()
        launcher.wait(timeout=10)


def test_off_the_main_thread_the_command_is_left_as_it_is() -> None:
    import threading

    from pdmesh.rpc.process import ends_with_this_thread

    got: list[list[str]] = []
    t = threading.Thread(target=lambda: got.append(ends_with_this_thread(["redis-server"])))
    t.start()
    t.join(timeout=10)
    assert got == [["redis-server"]]
