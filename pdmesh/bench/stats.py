"""Percentiles as every benchmark reports them (nearest rank, no interpolation), and the
median time of a repeated call."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``; NaN when there are none."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def median_seconds(fn: Callable[[], object], warmup: int = 3, reps: int = 10,
                   sync: Callable[[], None] = lambda: None) -> float:
    """Median wall seconds of ``fn()`` over ``reps`` calls after ``warmup`` untimed ones;
    ``sync`` waits for asynchronous work (a GPU's) before each clock read."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


@contextlib.contextmanager
def around_calls(obj: object, name: str, wrap: Wrap) -> Iterator[None]:
    """Within the block, ``obj.name`` (a method) is ``wrap(obj.name)``: a benchmark's way
    to time one part of a call it does not own. The instance attribute goes afterwards,
    and the class's method answers again."""
    setattr(obj, name, wrap(getattr(obj, name)))
    try:
        yield
    finally:
        delattr(obj, name)


def wall_seconds_into(into: list[float]) -> Wrap:
    """A ``wrap`` appending each call's wall seconds to ``into``."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - start)
        return run
    return wrap
