"""The router's scrape-time counters and gauges (routing decisions, fallbacks, health)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from pdmesh.index.mirrored_index import MirroredIndex
from services.router.request.stats import LATE_WHY

if TYPE_CHECKING:
    from pdmesh.rpc.feed_sink import Feeds
    from services.router.admission import AdmissionGate
    from services.router.prefill_routing import PrefillRouter
    from services.router.registry import Registry
    from services.router.request.stats import RouterStats


class ScrapedRouter(Protocol):
    """What a scrape reads of the router (``Router``), without importing it."""

    stats: RouterStats
    prefill_router: PrefillRouter
    feeds: Feeds
    flows: dict[str, Any]
    admission: AdmissionGate
    index: Any
    workers: Registry


Sample = tuple[str, str, str, float, dict[str, str]]


def router_snapshot(router: ScrapedRouter) -> list[Sample]:
    out: list[Sample] = []
    for key, n in list(router.stats.decisions.items()):
        policy, _, reason = key.partition("/")
        out.append(("counter", "pdmesh_routing_decisions", "Routing decisions by policy and reason",
                    n, {"policy": policy, "reason": reason}))
    index = router.prefill_router
    out += [
        ("counter", "pdmesh_local_prefills", "Prompts prefilled on the decode worker", router.stats.local_prefills, {}),
        ("counter", "pdmesh_index_fallbacks", "Index lookups that failed (consistent hashing used)",
         index.index_fallbacks, {}),
        ("counter", "pdmesh_prefill_retries", "Requests retried on another prefill worker",
         router.stats.prefill_retries, {}),
        ("counter", "pdmesh_decode_migrations", "Requests continued on another decode worker mid-stream",
         router.stats.migrations, {}),
        ("counter", "pdmesh_decode_calls", "Decode calls by how their tokens came: token feed or the call",
         router.feeds.fed, {"path": "feed"}),
        ("counter", "pdmesh_decode_calls", "Decode calls by how their tokens came: token feed or the call",
         router.feeds.unfed, {"path": "call"}),
        ("gauge", "pdmesh_index_staleness_seconds",
         "Seconds the index has been unreachable (0 while lookups succeed, idle or not)",
         time.monotonic() - index.index_failing_since if index.index_failing_since is not None else 0.0, {}),
        ("counter", "pdmesh_index_timeouts", "Index lookups that timed out (slow, not down)",
         index.index_timeouts, {}),
        ("gauge", "pdmesh_requests_in_flight", "Requests the router is serving", len(router.flows), {}),
        ("gauge", "pdmesh_requests_queued", "Requests waiting for an admission slot", router.admission.queued, {}),
        ("counter", "pdmesh_requests_refused", "Requests refused at capacity (RESOURCE_EXHAUSTED)",
         router.admission.refused, {}),
    ]
    for why in LATE_WHY:
        out.append(("counter", "pdmesh_reservations_given_back_late", "Reservations given back after half a "
                    "lease (the prefill call was cut off) or left to their lease (its worker did not stop in "
                    "time), not as soon as their request gave them up", router.stats.late_give_backs[why],
                    {"why": why}))
    if isinstance(router.index, MirroredIndex):
        for source, n in list(router.index.lookups.items()):
            out.append(("counter", "pdmesh_index_lookups", "Index lookups by what answered: the router's mirror "
                        "or Redis (while the mirror is not current)", n, {"source": source}))
        mirror = router.index.mirror
        out += [
            ("gauge", "pdmesh_index_mirror_current", "1 while the router's mirror of the index is current",
             1.0 if mirror.usable() else 0.0, {}),
            ("gauge", "pdmesh_index_mirror_blocks", "Blocks in the router's mirror of the index", len(mirror), {}),
            ("gauge", "pdmesh_index_mirror_lag_seconds", "How long the last index change the mirror applied had "
             "been in the log (Redis's clock against this host's; 0 once it has read everything)", mirror.lag_s, {}),
            ("counter", "pdmesh_index_mirror_resyncs", "Times the mirror read the whole index again (a gap in "
             "the log, Redis lost)", mirror.resyncs, {}),
        ]
    for w in router.workers.workers:
        out.append(("gauge", "pdmesh_worker_healthy", "1 when the worker answers and is compatible",
                    1.0 if w.healthy else 0.0, {"worker": w.worker_id, "role": w.role}))
    return out
