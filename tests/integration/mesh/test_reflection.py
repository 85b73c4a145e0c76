"""Server reflection as the clients that discover an API use it (grpcurl, grpcui, Postman):
nothing here imports pdmesh's generated code; every message class is built from the
descriptors the servers send."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2 as wire
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from pdmesh.launcher import Mesh
from tests.integration.mesh_tools import wait_idle

VERSIONS = ("grpc.reflection.v1", "grpc.reflection.v1alpha")
ROLE_SERVICES = {
    "router": {"pdmesh.v1.Generation", "pdmesh.v1.MeshAdmin"},
    "prefill": {"pdmesh.v1.Worker", "pdmesh.v1.Prefill"},
    "decode": {"pdmesh.v1.Worker", "pdmesh.v1.Decode"},
    "kvstore": {"pdmesh.v1.KVStore"},
}
ALWAYS = {"grpc.health.v1.Health", *(f"{v}.ServerReflection" for v in VERSIONS)}


class ReflectionClient:
    """A reflection client of one protocol version, as grpcurl's: it lists the services and
    fetches each one's file and that file's imports into a fresh descriptor pool. v1 and
    v1alpha share their messages on the wire, so v1alpha's classes frame both."""

    def __init__(self, channel: grpc.Channel, version: str) -> None:
        self._call = channel.stream_stream(
            f"/{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=wire.ServerReflectionRequest.SerializeToString,
            response_deserializer=wire.ServerReflectionResponse.FromString)
        self.pool = descriptor_pool.DescriptorPool()
        self._added: set[str] = set()

    def ask(self, **request: object) -> wire.ServerReflectionResponse:
        (answer,) = list(self._call(iter([wire.ServerReflectionRequest(**request)]), timeout=10))
        assert not answer.HasField("error_response"), answer.error_response
        return answer

    def services(self) -> set[str]:
        return {s.name for s in self.ask(list_services="").list_services_response.service}

    def load(self, symbol: str) -> None:
        self._add(self.ask(file_containing_symbol=symbol).file_descriptor_response.file_descriptor_proto)

    def _add(self, blobs: Iterator[bytes]) -> None:
        protos = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in blobs]
        by_name = {p.name: p for p in protos}
        for proto in protos:
            self._add_file(proto, by_name)

    def _add_file(self, proto: descriptor_pb2.FileDescriptorProto,
                  known: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
        if proto.name in self._added:
            return
        for dep in proto.dependency:
            if dep not in known:
                fetched = self.ask(file_by_filename=dep).file_descriptor_response.file_descriptor_proto
                known.update({p.name: p for p in map(descriptor_pb2.FileDescriptorProto.FromString, fetched)})
            self._add_file(known[dep], known)
        self.pool.Add(proto)
        self._added.add(proto.name)


def _processes(mesh: Mesh) -> list[tuple[str, str]]:
    return [(p.name.split("-")[0], p.address) for p in [*mesh.kvstore, *mesh.prefill, *mesh.decode, mesh.router]]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_server_lists_and_describes_its_services(mesh: Mesh, version: str) -> None:
    for role, address in _processes(mesh):
        with grpc.insecure_channel(address) as channel:
            client = ReflectionClient(channel, version)
            listed = client.services()
            assert listed == ROLE_SERVICES[role] | ALWAYS, (role, listed)
            for service in listed:
                client.load(service)
                methods = client.pool.FindServiceByName(service).methods
                assert methods, (role, service)


def test_generate_from_descriptors_alone_v1(mesh: Mesh) -> None:
    """grpcurl's way: v1 reflection, a request built from JSON, the stream read back."""
    with grpc.insecure_channel(mesh.router_address) as channel:
        client = ReflectionClient(channel, "grpc.reflection.v1")
        client.load("pdmesh.v1.Generation")
        texts, last = _generate(channel, client.pool)
    assert last["finishReason"] == "FINISH_REASON_LENGTH"
    assert last["usage"]["completionTokens"] == 6
    assert sum(len(t.get("tokenIds", [])) for t in texts) == 6
    wait_idle(mesh)


def test_generate_through_protoreflection_database_v1alpha(mesh: Mesh) -> None:
    """grpcio-reflection's own client database (v1alpha), as Python tools use it."""
    with grpc.insecure_channel(mesh.router_address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert "pdmesh.v1.Generation" in set(database.get_services())
        texts, last = _generate(channel, descriptor_pool.DescriptorPool(database))
    assert last["usage"]["completionTokens"] == 6
    assert "".join(t.get("text", "") for t in texts)
    wait_idle(mesh)


def _generate(channel: grpc.Channel, pool: descriptor_pool.DescriptorPool) -> tuple[list[dict], dict]:
    method = pool.FindServiceByName("pdmesh.v1.Generation").methods_by_name["Generate"]
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    request = json_format.ParseDict(
        {"text": "reflection says hello", "sampling": {"maxTokens": 6, "temperature": 0}}, request_cls())
    call = channel.unary_stream(f"/{method.containing_service.full_name}/{method.name}",
                                request_serializer=request_cls.SerializeToString,
                                response_deserializer=response_cls.FromString)
    answers = [json_format.MessageToDict(r) for r in call(request, timeout=60)]
    return answers, answers[-1]


def test_health_watch_streams(mesh: Mesh) -> None:
    """Health's server stream (an async handler that writes) answers through the interceptor."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(mesh.router_address) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10)
        first = next(stream)
        stream.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
