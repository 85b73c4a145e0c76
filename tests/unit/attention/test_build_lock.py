"""A kernel build folder is held by one live build at a time, and a build killed midway
blocks no later one: the lock torch leaves behind is removed as soon as no build holds
pdmesh's own ``flock``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdmesh.attention.build_lock import OWN_LOCK, TORCH_LOCK, BuildLockTimeoutError, build_lock

_HOLDER = """
import fcntl, os, sys, time
from pathlib import Path
d = Path(sys.argv[1])
fd = os.open(d / "{own}", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
(d / "{torch}").touch()  # as torch's build does while it runs
print("held", flush=True)
time.sleep(120)
""".format(own=OWN_LOCK, torch=TORCH_LOCK)


def _holder(build_dir: Path) -> subprocess.Popen[str]:
    build_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(build_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_left_by_a_killed_build_is_removed_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / TORCH_LOCK).touch()  # fresh, yet no build holds the folder
    start = time.monotonic()
    with caplog.at_level(logging.WARNING), build_lock(tmp_path, wait_s=5):
        assert not (tmp_path / TORCH_LOCK).exists()
    assert time.monotonic() - start < 1
    assert "did not finish" in caplog.text


def test_a_live_build_is_waited_for_and_its_death_ends_the_wait(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    proc = _holder(tmp_path)
    try:
        with caplog.at_level(logging.INFO):
            with pytest.raises(BuildLockTimeoutError, match="remove"):
                with build_lock(tmp_path, wait_s=0.5, poll_s=0.05):
                    pass
        assert f"waiting for process {proc.pid}'s kernel build" in caplog.text
        assert (tmp_path / TORCH_LOCK).exists()  # a live build's lock is left alone
        os.kill(proc.pid, signal.SIGKILL)  # killed midway: its torch lock stays behind
        proc.wait(10)
        start = time.monotonic()
        with build_lock(tmp_path, wait_s=5, poll_s=0.05):
            assert not (tmp_path / TORCH_LOCK).exists()
        assert time.monotonic() - start < 1
    finally:
        proc.kill()
        proc.wait(10)


def test_the_folder_is_free_again_after_a_build_however_it_ends(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with build_lock(tmp_path, wait_s=1):
            raise RuntimeError("the compiler failed")
    with build_lock(tmp_path, wait_s=0.2, poll_s=0.05):
        pass
