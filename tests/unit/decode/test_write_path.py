"""A decode worker stops progress passes for awaited KV only after writes that landed
within their writers' calls, and takes them up again at once after one that did not."""

from __future__ import annotations

from services.decode.reservations import Reservations
from services.decode.write_path import INLINE_RUN, TRUST_S, WritePath


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_passes_stop_after_a_run_of_inline_writes_and_resume_after_one_that_was_not() -> None:
    clock = Clock()
    path = WritePath(clock)
    assert path.needs_passes()  # nothing seen yet: as before
    for _ in range(INLINE_RUN - 1):
        path.saw(True)
    assert path.needs_passes()
    path.saw(True)
    assert not path.needs_passes()
    path.saw(False)  # a write that needed this worker (or a writer that does not say)
    assert path.needs_passes()
    for _ in range(INLINE_RUN):
        path.saw(True)
    assert path.needs_passes()  # inline again, but within TRUST_S of the one that was not
    clock.t += TRUST_S + 1
    assert not path.needs_passes()


def test_reservations_await_kv_with_passes_only_while_the_path_needs_them() -> None:
    clock = Clock()
    res = Reservations(WritePath(clock))
    assert not res.awaiting_kv()  # nothing reserved
    res.add("r1", 10_000)
    assert res.awaiting_kv()
    for _ in range(INLINE_RUN):
        res.writes.saw(True)
    assert not res.awaiting_kv()  # reserved, but its write will land without us
    res.writes.saw(False)
    assert res.awaiting_kv()
