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
