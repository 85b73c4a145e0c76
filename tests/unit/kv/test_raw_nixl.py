"""The raw NIXL ceiling ``bench mesh`` compares the mesh's KV writes with."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

import pytest

from pdmesh.bench.raw_nixl import raw_nixl_gib_s, target_ready


def test_a_target_that_dies_before_it_is_ready_is_an_error_not_a_hang() -> None:
    ctx = mp.get_context("spawn")
    here, _there = ctx.Pipe()
    proc = ctx.Process(target=sys.exit, args=(3,))
    proc.start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited \(3\)"):
        target_ready(here, proc, timeout=60)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("fresh", [False, True])
def test_raw_writes_measure_a_rate_for_the_same_and_for_fresh_blocks(fresh: bool) -> None:
    assert raw_nixl_gib_s(64 * 1024, 4, fresh=fresh) > 0


class _Stuck:
    """A transport whose write never ends, or fails: faults a live NIXL pair cannot be made
    to show on demand."""

    def __init__(self, state) -> None:  # type: ignore[no-untyped-def]
        self.state = state

    def poll(self, handle: object):  # type: ignore[no-untyped-def]
        return self.state


def test_a_raw_write_that_never_ends_or_fails_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    from pdmesh.bench import raw_nixl
    from pdmesh.kv.transfer.base import TransferState

    monkeypatch.setattr(raw_nixl, "WRITE_DEADLINE_S", 0.05)
    with pytest.raises(TimeoutError, match="still running"):
        raw_nixl.wait_written(_Stuck(TransferState.PENDING), object(), spin_s=0.001)
    with pytest.raises(RuntimeError, match="failed"):
        raw_nixl.wait_written(_Stuck(TransferState.FAILED), object())
    raw_nixl.wait_written(_Stuck(TransferState.DONE), object())


def test_a_failure_while_writing_stops_the_target_process() -> None:
    from pdmesh.bench.raw_nixl import raw_target

    with pytest.raises(TimeoutError, match="stuck"), raw_target(64 * 1024, 4) as (meta, base):
        assert meta and base
        raise TimeoutError("a write stuck")  # as wait_written raises it
    assert mp.active_children() == []  # told to stop (or killed), and joined
