"""Percentiles as every benchmark reports them (nearest rank, no interpolation), and the
median time of a repeated call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
