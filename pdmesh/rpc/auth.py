"""Bearer-token authentication for a public gRPC front, in one interceptor.

Calls to the guarded services must carry ``authorization: Bearer <key>`` metadata; the
health and reflection services stay open (load balancers probe them). Internal hops are
authenticated by mutual TLS instead (``rpc/tls.py``), not by this key.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from pdmesh.rpc.refusal import refusing


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, api_key: str, services: Sequence[str]) -> None:
        self._expected = f"Bearer {api_key}".encode()
        self._prefixes = tuple(f"/{s}/" for s in services)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        if not details.method.startswith(self._prefixes):
            return await continuation(details)
        sent = next((v for k, v in details.invocation_metadata or () if k == "authorization"), "")
        raw = sent.encode() if isinstance(sent, str) else bytes(sent)
        if hmac.compare_digest(raw, self._expected):
            return await continuation(details)
        why = ("missing or wrong API key: send the metadata 'authorization: Bearer <key>' with the router's "
               "--api-key (PDMESH_API_KEY)" if sent else
               "this router requires an API key: send the metadata 'authorization: Bearer <key>'")
        return refusing(await continuation(details), grpc.StatusCode.UNAUTHENTICATED, why)
