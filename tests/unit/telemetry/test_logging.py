import asyncio
import io
import json
import logging

from pdmesh.telemetry.logging_setup import JsonFormatter, _RequestContext, bind_request


def test_json_logs_carry_request_and_trace_ids_per_task() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    span = TracerProvider().get_tracer("t").start_span("s")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(_RequestContext())
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("pdmesh.test")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    async def serve(rid: str, with_span: bool) -> None:
        bind_request(rid, span if with_span else None)
        await asyncio.sleep(0)
        log.info("reservation %s expired", rid)

    async def main() -> None:
        await asyncio.gather(serve("r-1", True), serve("r-2", False))

    try:
        asyncio.run(main())
    finally:
        log.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_rid = {line["request_id"]: line for line in lines}
    assert by_rid["r-1"]["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert "trace_id" not in by_rid["r-2"]  # each task sees only its own request
