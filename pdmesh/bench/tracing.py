"""``pdmesh bench tracing``: what tracing costs per request, off and on.

Replays the span work one request does across the mesh (router: generate, route, index
lookup; decode: reserve, decode; prefill: prefill, kv_transfer; kvstore: get, put — each
with context injection / extraction through gRPC metadata) N times, first with tracing off
(the API's no-op tracer, how pdmesh runs without ``OTEL_EXPORTER_OTLP_ENDPOINT``), then with
the SDK and a batch processor exporting to memory. Reports microseconds per request.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pdmesh.telemetry import tracing


class _Meta:
    def __init__(self, md) -> None:
        self.md = md or ()

    def invocation_metadata(self):
        return self.md


def _one_request() -> None:
    root = tracing.start_span("router.generate", None, request_id="r", prompt_tokens=100)
    ctx = tracing.child_context(root)
    route = tracing.start_span("router.route", ctx, decode="d0")
    tracing.start_span("index.lookup", tracing.child_context(route), blocks=6).end()
    route.end()
    meta = tracing.outgoing(ctx)
    for name in ("decode.reserve", "prefill", "decode"):
        hop = tracing.start_span(name, tracing.incoming(_Meta(meta)), request_id="r")
        if name == "prefill":
            sctx = tracing.child_context(hop)
            tracing.start_span("kv_transfer", sctx, bytes=1 << 20).end()
            inner = tracing.outgoing(sctx)
            tracing.start_span("kvstore.get", tracing.incoming(_Meta(inner))).end()
            tracing.start_span("kvstore.put", tracing.incoming(_Meta(inner))).end()
        hop.end()
    root.end()


def _per_request_us(n: int) -> float:
    for _ in range(min(n, 200)):
        _one_request()
    start = time.perf_counter()
    for _ in range(n):
        _one_request()
    return (time.perf_counter() - start) / n * 1e6


def run_tracing_bench(args: argparse.Namespace) -> dict[str, float]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    n = args.requests
    off = _per_request_us(n)
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracing._enabled = True  # what setup_tracing does once an endpoint is configured
    on = _per_request_us(n)
    provider.shutdown()
    result = {"requests": n, "off_us_per_request": off, "on_us_per_request": on,
              "spans_per_request": 10}
    print("\npdmesh bench tracing — span work of one request across the mesh (10 spans, 4 hops)")
    print(f"{'tracing':<10} {'µs / request':>14}")
    print(f"{'off':<10} {off:14.1f}")
    print(f"{'on':<10} {on:14.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result
