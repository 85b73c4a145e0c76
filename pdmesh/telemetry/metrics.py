"""Prometheus metrics: one registry per process, served on ``/metrics``.

Latencies are histograms observed once per request or per streamed response (never per
engine step); gauges and cumulative counters that mirror state the process already keeps
(block pool, queues, routing counters) are read at scrape time by collectors, so the hot
path pays nothing for them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class RequestMetrics:
    """Per-request latencies, shared by router and workers (label ``role``)."""

    def __init__(self, registry: CollectorRegistry, role: str) -> None:
        self.role = role
        self.requests = Counter("pdmesh_requests", "Requests finished, by finish reason",
                                ["role", "finish_reason"], registry=registry)
        self.ttft = Histogram("pdmesh_time_to_first_token_seconds", "Arrival to first token",
                              ["role"], buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram("pdmesh_inter_token_latency_seconds", "Gap between streamed tokens",
                             ["role"], buckets=ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("pdmesh_request_seconds", "Arrival to last token",
                             ["role"], buckets=LATENCY_BUCKETS, registry=registry)

    def stream(self) -> StreamTimer:
        return StreamTimer(self)


class StreamTimer:
    """Times one streamed request: call ``tokens(n)`` per response, ``done(reason)`` at the end."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.m = metrics
        self.start = time.monotonic()
        self.last: float | None = None
        self.first: float | None = None
        """When the first token was streamed."""

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.monotonic()
        if self.last is None:
            self.first = now
            self.m.ttft.labels(self.m.role).observe(now - self.start)
        else:
            self.m.itl.labels(self.m.role).observe((now - self.last) / n)
        self.last = now

    def done(self, finish_reason: str) -> None:
        self.m.e2e.labels(self.m.role).observe(time.monotonic() - self.start)
        self.m.requests.labels(self.m.role, finish_reason).inc()


class SnapshotCollector(Collector):
    """Gauges, counters and histograms computed from a snapshot function at scrape time.

    A histogram's value is ``(counts, total)``: ``counts[i]`` observations equal to ``i``
    (small integer distributions, such as accepted draft lengths) and their sum.
    """

    def __init__(self, snapshot: Callable[[], Iterable[tuple[str, str, str, Any, dict[str, str]]]]) -> None:
        self.snapshot = snapshot

    def collect(self):
        families: dict[str, Any] = {}  # Gauge-, Counter- or HistogramMetricFamily; add_metric differs by kind
        for kind, name, doc, value, labels in self.snapshot():
            fam = families.get(name)
            if fam is None:
                cls = _FAMILIES[kind]
                fam = cls(name, doc, labels=sorted(labels))
                families[name] = fam
            values = [labels[k] for k in sorted(labels)]
            if kind == "histogram":
                counts, total = value
                cumulative = list(itertools.accumulate(counts))
                buckets = [(str(float(i)), c) for i, c in enumerate(cumulative)]
                fam.add_metric(values, buckets + [("+Inf", cumulative[-1] if cumulative else 0)], total)
            else:
                fam.add_metric(values, value)
        return list(families.values())


_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}


def serve_metrics(registry: CollectorRegistry, host: str, port: int, port_file: str) -> int | None:
    """Serve ``/metrics``; port -1 disables, 0 picks a free port (written to ``{port_file}.metrics``)."""
    if port < 0:
        return None
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound = int(server.server_port)
    if port_file:
        tmp = Path(port_file + ".metrics.tmp")
        tmp.write_text(str(bound))
        tmp.replace(port_file + ".metrics")
    return bound
