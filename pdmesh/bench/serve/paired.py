"""Two targets' rounds taken as pairs: each round's ratio, their geometric mean, and a
bootstrap interval around it.

Why pairs: our benchmark machines drift by up to 20% between minutes (docs/performance.md
sections 42 and 46-47), more than the margins the speed goals ask about. The two runs of a
round follow each other, so their ratio cancels most of the drift they share, and the
spread of those ratios over rounds says whether one target is slower, where one round
cannot. Running a target against itself (``--compare`` equal to ``--target``) shows the
spread the machine alone gives a ratio that is 1.0 by construction."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

MIN_ROUNDS = 3
"""Fewer pairs than this give no interval: resampling one or two values says nothing."""


@dataclass(frozen=True)
class Paired:
    """``b / a`` per round, their geometric mean, and its ``level`` bootstrap interval
    (``low``, ``high``; NaN with fewer than ``MIN_ROUNDS`` pairs)."""

    ratios: tuple[float, ...]
    geomean: float
    low: float
    high: float
    level: float

    @property
    def below_one(self) -> int:
        """Rounds in which ``b`` came out below ``a``."""
        return sum(r < 1.0 for r in self.ratios)

    def describe(self) -> str:
        rounds = " ".join(f"{r:.3f}" for r in self.ratios)
        interval = (f"{self.level:.0%} interval {self.low:.3f}-{self.high:.3f}x" if not math.isnan(self.low)
                    else f"no interval under {MIN_ROUNDS} rounds")
        return (f"geometric mean {self.geomean:.3f}x, {interval}; {self.below_one} of {len(self.ratios)} "
                f"rounds below 1.0x (per round: {rounds})")


def paired(a: list[float], b: list[float], level: float = 0.95, resamples: int = 10_000,
           seed: int = 0) -> Paired:
    """Pairs ``a[i]``, ``b[i]`` (one round each, all positive). The interval is the
    percentile bootstrap of the mean log ratio, with a fixed seed so that a report can be
    recomputed from its JSON."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired rounds need as many values on each side, and some: {len(a)} and {len(b)}")
    if min(a + b) <= 0:
        raise ValueError("paired rounds take ratios of positive figures only")
    logs = [math.log(y / x) for x, y in zip(a, b)]
    mean = statistics.fmean(logs)
    low = high = float("nan")
    if len(logs) >= MIN_ROUNDS:
        rng = random.Random(seed)
        means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples))
        tail = (1 - level) / 2
        low, high = math.exp(means[int(tail * resamples)]), math.exp(means[int((1 - tail) * resamples) - 1])
    return Paired(tuple(math.exp(v) for v in logs), math.exp(mean), low, high, level)
