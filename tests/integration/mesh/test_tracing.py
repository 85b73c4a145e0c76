"""One trace per request across the real mesh processes, received over OTLP/gRPC in-test."""

from __future__ import annotations

import random
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from tests.integration.mesh_tools import WORKER_ARGS


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []  # (service name, span)

    def Export(self, request, context):  # noqa: N802
        for rs in request.resource_spans:
            service = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
            for ss in rs.scope_spans:
                self.spans += [(service, s) for s in ss.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture()
def receiver():  # type: ignore[no-untyped-def]
    rec = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(rec, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield rec, port
    server.stop(0)


def test_one_trace_spans_router_prefill_transfer_and_decode(llama_dir: Path, tmp_path: Path, receiver,
                                                            monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rec, port = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=1, worker_args=WORKER_ARGS,
                    log_dir=str(tmp_path))
    with Mesh(spec) as mesh, Client(mesh.router_address) as c:
        prompt = [random.Random(7).randrange(5, 1000) for _ in range(70)]
        out = c.complete(prompt, max_tokens=4, temperature=0, request_id="traced-1")
        assert len(out.token_ids) == 4
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            names = {s.name for _, s in rec.spans}
            if {"router.generate", "prefill", "kv_transfer", "decode", "kvstore.put"} <= names:
                break
            time.sleep(0.2)
    roots = [s for _, s in rec.spans if s.name == "router.generate"]
    assert len(roots) == 1
    trace_id = roots[0].trace_id
    mine = [(svc, s) for svc, s in rec.spans if s.trace_id == trace_id]
    services = {svc for svc, _ in mine}
    assert {"pdmesh-router", "pdmesh-prefill", "pdmesh-decode", "pdmesh-kvstore"} <= services
    ids = {s.span_id for _, s in mine}
    for _, s in mine:  # every parent is in the same trace; only the root has none
        assert (not s.parent_span_id and s is roots[0]) or s.parent_span_id in ids, s.name
    by_name = {s.name: s for _, s in mine}
    attrs = {a.key: a.value for a in by_name["kv_transfer"].attributes}
    assert attrs["pdmesh.bytes"].int_value > 0 and attrs["pdmesh.blocks"].int_value == 5
    assert by_name["kv_transfer"].parent_span_id == by_name["prefill"].span_id
    route = {a.key: a.value for a in by_name["router.route"].attributes}
    assert route["pdmesh.prefill"].string_value == "prefill-0"
    prefill = {a.key: a.value for a in by_name["prefill"].attributes}
    assert prefill["pdmesh.computed_tokens"].int_value + prefill["pdmesh.cached_tokens"].int_value == 70
    assert any(e.name == "prefill_chunk" for e in by_name["prefill"].events)
    decode = {a.key for a in by_name["decode"].attributes}
    # No kv_wait_ms: Decode comes only after the prefill worker's writes are DONE.
    assert {"pdmesh.first_token_ms", "pdmesh.finish_reason"} <= decode
