"""Two targets' rounds taken as pairs: each round's ratio, their geometric mean, and a
Student-t interval around it.

Why pairs: our benchmark machines drift by up to 20% between minutes (docs/performance/log.md
sections 42 and 46-47), more than the margins the speed goals ask about. The two runs of a
round follow each other, so their ratio cancels most of the drift they share, and the
spread of those ratios over rounds says whether one target is slower, where one round
cannot. Running a target against itself (``--compare`` equal to ``--target``) shows the
spread the machine alone gives a ratio that is 1.0 by construction."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MIN_ROUNDS = 3
"""Fewer pairs than this give no interval: two rounds' spread says little about a third."""


@dataclass(frozen=True)
class Paired:
    """``b / a`` per round, their geometric mean, and its ``level`` interval (``low``,
    ``high``; NaN with fewer than ``MIN_ROUNDS`` pairs)."""

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


def paired(a: list[float], b: list[float], level: float = 0.95) -> Paired:
    """Pairs ``a[i]``, ``b[i]`` (one round each, all positive). The interval is Student's t
    on the mean log ratio: with the 3-16 rounds a benchmark affords it is wider than a
    percentile bootstrap (which understates the spread of few values), so a claim that
    one side is not slower errs on the side of not making it."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired rounds need as many values on each side, and some: {len(a)} and {len(b)}")
    if min(a + b) <= 0:
        raise ValueError("paired rounds take ratios of positive figures only")
    logs = [math.log(y / x) for x, y in zip(a, b)]
    mean = statistics.fmean(logs)
    low = high = float("nan")
    if len(logs) >= MIN_ROUNDS:
        half = t_quantile(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        low, high = math.exp(mean - half), math.exp(mean + half)
    return Paired(tuple(math.exp(v) for v in logs), math.exp(mean), low, high, level)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom:
    the density integrated by Simpson's rule, inverted by bisection (no scipy here)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile takes 0.5 < p < 1 and df >= 1, not {p} and {df}")
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, steps: int = 2000) -> float:
        h = x / steps
        f = [scale * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2
