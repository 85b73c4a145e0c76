"""Ask a pdmesh service whether it serves: the standard gRPC health protocol, with TLS.

Used by the launcher while a mesh starts, by ``pdmesh probe`` and ``pdmesh status``.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdmesh.rpc.tls import TLSFiles


def is_serving(address: str, tls: TLSFiles | None = None) -> bool:
    return health_status(address, tls.channel_credentials() if tls is not None else None) == "SERVING"


def health_status(address: str, credentials: grpc.ChannelCredentials | None = None) -> str:
    """The service's overall gRPC health (SERVING, NOT_SERVING ...) or why there is none."""
    try:
        with (grpc.secure_channel(address, credentials) if credentials is not None
              else grpc.insecure_channel(address)) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
    except grpc.RpcError as exc:
        return f"unreachable ({exc.code().name})"
