"""The router's counters of what requests did, in one object the request path is handed
(``Router.stats``): read by RouterStats and /metrics (``services/router/metrics.py``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

LATE_WHY = ("cut_off", "not_stopped")
"""Why a reservation went back late (``RouterStats.late_give_backs``)."""


@dataclass
class RouterStats:
    decisions: Counter[str] = field(default_factory=Counter)
    """Routing decisions, as ``{policy}/{reason}``, ``decode/{reason}`` and ``local/{reason}``."""
    local_prefills: int = 0
    """Prompts prefilled on their decode worker."""
    prefill_retries: int = 0
    """Requests retried on another prefill worker."""
    migrations: int = 0
    """Requests moved to another decode worker mid-stream."""
    late_give_backs: Counter[str] = field(default_factory=Counter)
    """Reservations not given back as soon as their request gave them up, by why (``LATE_WHY``;
    ``handoff.give_back_when_stopped``): the prefill call was cut off (back after half a
    lease), or its worker did not stop in time (left to the lease)."""
