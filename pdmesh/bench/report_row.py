"""One line of ``pdmesh bench mesh``'s table and JSON: a figure, and the baseline it is read against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    section: str
    metric: str
    value: float
    baseline: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None
