"""OpenTelemetry tracing: one trace per request across router, prefill, transfer, decode.

Configured by the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER`` …) when the process starts. With no endpoint (or
``OTEL_SDK_DISABLED=true``) the API's no-op tracer is used and a span costs a function call.
W3C trace context travels in gRPC metadata: ``outgoing()`` builds the metadata for a call,
``incoming(context)`` restores the caller's context in a handler.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

_enabled = False


def setup_tracing(default_service_name: str) -> bool:
    """Install an OTLP/gRPC exporter when the environment asks for one; returns whether it did."""
    global _enabled
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return False
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or default_service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


def shutdown_tracing() -> None:
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()


def tracer() -> trace.Tracer:
    return trace.get_tracer("pdmesh")


def outgoing(ctx: otel_context.Context | None) -> Sequence[tuple[str, str]] | None:
    """gRPC metadata carrying ``ctx``'s trace context (None when tracing is off).

    Contexts are passed explicitly, never attached: handlers here are async generators,
    and attaching across a ``yield`` would detach in another task's context.
    """
    if not _enabled or ctx is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return tuple(carrier.items()) or None


def start_span(name: str, parent: otel_context.Context | None, **attributes: object) -> trace.Span:
    """A span under ``parent`` (a context from ``incoming`` or ``child_context``)."""
    if not _enabled:
        return trace.INVALID_SPAN  # shared no-op span: tracing off costs a branch
    return tracer().start_span(name, context=parent, attributes={
        f"pdmesh.{k}": v for k, v in attributes.items() if v is not None  # type: ignore[misc]
    })


def child_context(span: trace.Span) -> otel_context.Context | None:
    if not _enabled:
        return None
    return trace.set_span_in_context(span)


def incoming(grpc_context) -> otel_context.Context | None:
    """The caller's trace context from a handler's invocation metadata."""
    if not _enabled:
        return None
    carrier = {k: v for k, v in (grpc_context.invocation_metadata() or ()) if isinstance(v, str)}
    return propagate.extract(carrier)
