"""Start-up measurements take turns across processes (``pdmesh.measure_lock``)."""

from __future__ import annotations

import logging
import select
import subprocess
import sys
import time
from pathlib import Path

from pdmesh.measure_lock import measuring_alone, not_while_measuring

HOLDER = """
import sys, time
from pathlib import Path
from pdmesh import measure_lock
with getattr(measure_lock, sys.argv[3])("holder", path=Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(lock: Path, seconds: float, how: str = "measuring_alone") -> subprocess.Popen[str]:
    """A process holding the lock for ``seconds`` (``how``: exclusive or shared), once it
    says so (within 60 s)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(seconds), how], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready:
        proc.kill()
        raise AssertionError("the lock holder did not start within 60 s")
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_process_waits_for_the_first_measurement_to_end(tmp_path: Path) -> None:
    lock = tmp_path / "measure.lock"
    proc = _holder(lock, 0.6)
    try:
        start = time.monotonic()
        with measuring_alone("test", path=lock) as held:
            waited = time.monotonic() - start
        assert held and 0.3 < waited < 10
    finally:
        proc.wait(10)
    with measuring_alone("test", path=lock) as held:  # free again: no wait
        assert held


def test_a_lock_held_past_the_deadline_measures_anyway_and_says_so(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    lock = tmp_path / "measure.lock"
    proc = _holder(lock, 30)
    try:
        with caplog.at_level(logging.WARNING, logger="pdmesh.measure_lock"):
            start = time.monotonic()
            with measuring_alone("the probe", timeout=0.2, path=lock) as held:
                assert not held and time.monotonic() - start < 5
        assert "the probe goes ahead beside it" in caplog.text
    finally:
        proc.kill()
        proc.wait(10)


def test_a_lock_file_that_cannot_be_opened_is_said_and_not_fatal(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.WARNING, logger="pdmesh.measure_lock"):
        with measuring_alone("the probe", path=tmp_path / "missing-folder" / "measure.lock") as held:
            assert not held
    assert "cannot open" in caplog.text


def test_warm_ups_run_beside_each_other_but_never_beside_a_measurement(tmp_path: Path) -> None:
    lock = tmp_path / "measure.lock"
    warming = _holder(lock, 30, "not_while_measuring")
    try:
        start = time.monotonic()
        with not_while_measuring("another warm-up", path=lock) as held:
            assert held and time.monotonic() - start < 1  # shared: no wait
        with measuring_alone("a probe", timeout=0.3, path=lock) as held:
            assert not held  # a probe waits for the warm-up (here past its deadline)
    finally:
        warming.kill()
        warming.wait(10)
    probing = _holder(lock, 0.6)
    try:
        start = time.monotonic()
        with not_while_measuring("a warm-up", path=lock) as held:
            waited = time.monotonic() - start
        assert held and 0.3 < waited < 10  # a warm-up waits for the probe to end
    finally:
        probing.wait(10)
