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

from pdmesh.attention.build_lock import (
    BUILD_MARK_ENV,
    OWN_LOCK,
    TORCH_LOCK,
    BuildLockTimeoutError,
    BuildMark,
    build_lock,
)

_HOLDER = f"""
import fcntl, os, sys, time
from pathlib import Path
d = Path(sys.argv[1])
fd = os.open(d / "{OWN_LOCK}", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
(d / "{TORCH_LOCK}").touch()  # as torch's build does while it runs
print("held", flush=True)
time.sleep(120)
"""


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


def test_the_build_mark_exists_only_while_a_build_runs_and_only_when_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = tmp_path / "decode-0.building"
    monkeypatch.delenv(BUILD_MARK_ENV, raising=False)
    with BuildMark() as shown:  # no launcher waits on this process: nothing to show
        shown.show()
        assert not mark.exists()
    monkeypatch.setenv(BUILD_MARK_ENV, str(mark))
    with BuildMark():  # the kernels are built already: never shown
        assert not mark.exists()
    with pytest.raises(RuntimeError):
        with BuildMark() as shown:
            assert not mark.exists()
            shown.show()  # compiling, or waiting for another process's compile
            assert mark.exists()
            raise RuntimeError("the compiler failed")
    assert not mark.exists()


def test_a_worker_that_builds_the_kernels_is_given_more_time_to_start(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A real process showing the mark as a building worker does (through the variable
    the launcher sets) is waited for ``BUILD_WAIT_S`` longer, and the error says why; one
    that shows nothing times out at ``start_timeout_s``."""
    from pdmesh import launcher, start_watch

    monkeypatch.setattr(start_watch, "BUILD_WAIT_S", 2.0)
    mesh = launcher.Mesh(launcher.MeshSpec(model="m", log_dir=str(tmp_path), start_timeout_s=0.5))
    building = ("import time\nfrom pdmesh.attention.build_lock import BuildMark\n"
                "with BuildMark() as m:\n    m.show(); time.sleep(60)")
    for code, least, most, why in ((building, 2.5, 6.0, "building pdmesh's CPU kernels"),
                                   ("import time; time.sleep(60)", 0.5, 2.0, "")):
        env = dict(os.environ, **{BUILD_MARK_ENV: str(mesh.watch.build_mark("prefill-0"))})
        popen = subprocess.Popen([sys.executable, "-c", code], env=env)
        try:
            shown = time.monotonic() + 30  # the child's start on a loaded machine is not what is timed
            while why and not mesh.watch.build_mark("prefill-0").exists() and time.monotonic() < shown:
                time.sleep(0.05)
            start = time.monotonic()
            with pytest.raises(RuntimeError, match="not ready after") as err:
                mesh.await_ready(launcher.Proc("prefill-0", popen))
            assert least <= time.monotonic() - start < most
            assert why in str(err.value)
        finally:
            popen.kill()
            popen.wait(10)
        mesh.watch.build_mark("prefill-0").unlink(missing_ok=True)


def test_a_filesystem_without_flock_builds_under_torchs_lock_alone_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Some network mounts refuse ``flock`` (ENOLCK): a fault no local folder can cause,
    so the call is wrapped to raise it."""
    import errno

    from pdmesh.attention import build_lock as module

    def refuse(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(module.fcntl, "flock", refuse)
    (tmp_path / TORCH_LOCK).touch()
    ran = False
    with caplog.at_level(logging.WARNING), build_lock(tmp_path, wait_s=1):
        ran = True
    assert ran and "takes no flock" in caplog.text
    assert (tmp_path / TORCH_LOCK).exists()  # without our flock, nothing says the build is dead
