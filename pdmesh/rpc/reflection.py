"""gRPC server reflection, both versions clients speak: ``grpc.reflection.v1`` (grpcurl,
grpcui and Postman ask it first) and ``grpc.reflection.v1alpha`` (older clients, and
grpcio-reflection's own ``ProtoReflectionDescriptorDatabase``).

grpcio-reflection 1.85 ships only v1alpha. v1 is the same protocol under a new package
name (the messages and field numbers did not change when it was promoted), so v1 is
served by the same servicer: its messages are read and written with v1alpha's classes,
whose bytes on the wire are identical, and v1's file descriptor, derived from v1alpha's by
renaming the package, is added to the descriptor pool so that a client can describe the
reflection service itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

V1ALPHA_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
METHOD = "ServerReflectionInfo"


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve v1 and v1alpha reflection on ``server`` for ``service_names`` (plus the two
    reflection services)."""
    _add_v1_descriptor()
    names = [*service_names, V1_SERVICE, V1ALPHA_SERVICE]
    servicer = ReflectionServicer(names)
    for service in (V1_SERVICE, V1ALPHA_SERVICE):
        handler = grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
            response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {METHOD: handler}),))


def _add_v1_descriptor() -> None:
    """Put ``grpc/reflection/v1/reflection.proto`` into the default pool, once per process."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = "." + v1alpha_pb2.DESCRIPTOR.package + ".", ".grpc.reflection.v1."
    proto.name, proto.package = V1_FILE, "grpc.reflection.v1"
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    proto.options.ClearField("deprecated")
    for message in proto.message_type:
        for fld in message.field:
            if fld.type_name.startswith(old):
                fld.type_name = new + fld.type_name[len(old):]
    for method in proto.service[0].method:
        method.input_type = new + method.input_type[len(old):]
        method.output_type = new + method.output_type[len(old):]
    pool.AddSerializedFile(proto.SerializeToString())
