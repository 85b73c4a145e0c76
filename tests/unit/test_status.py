"""The status a caller gets when a call the service made to another one failed."""

from __future__ import annotations

import grpc
import pytest

from pdmesh.rpc.status import message_for, status_for
from services.router.http.errors import status_of


def _peer_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED,
                                  grpc.StatusCode.DATA_LOSS])
def test_a_failed_peer_is_unavailable_never_internal(code: grpc.StatusCode) -> None:
    exc = _peer_error(code, "Internal error from Core")
    assert status_for(exc) is grpc.StatusCode.UNAVAILABLE
    assert message_for(exc) == f"a worker failed during the request ({code.name}: Internal error from Core); retry"
    http = status_of(exc)
    assert (http.status, http.code) == (503, "unavailable")


@pytest.mark.parametrize(("code", "http_status"), [(grpc.StatusCode.INVALID_ARGUMENT, 400),
                                                   (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
                                                   (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
                                                   (grpc.StatusCode.UNAVAILABLE, 503)])
def test_a_peer_status_the_caller_can_act_on_passes_through(code: grpc.StatusCode, http_status: int) -> None:
    exc = _peer_error(code, "prompt: too long")
    assert status_for(exc) is code and message_for(exc) == "prompt: too long"
    assert (status_of(exc).status, status_of(exc).message) == (http_status, "prompt: too long")
