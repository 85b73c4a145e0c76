"""One mapping from pdmesh's typed errors to gRPC status codes, used by every servicer."""

from __future__ import annotations

import asyncio

import grpc

from pdmesh.errors import (
    CapacityError,
    IncompatibleWorkerError,
    InvalidRequestError,
    TransferFailedError,
    UnavailableError,
    UnknownRequestError,
    UnsupportedModelError,
)

_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (UnsupportedModelError, grpc.StatusCode.INVALID_ARGUMENT),
    (CapacityError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnknownRequestError, grpc.StatusCode.NOT_FOUND),
    (IncompatibleWorkerError, grpc.StatusCode.FAILED_PRECONDITION),
    (TransferFailedError, grpc.StatusCode.ABORTED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (asyncio.TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
)


_PEER_FAILURE = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED,
                           grpc.StatusCode.DATA_LOSS})
"""Codes a call to another pdmesh service ends with when that service dies or resets the
stream mid-call (gRPC's core reports a killed peer's broken stream as INTERNAL "Internal
error from Core" at times): the caller's request was fine and a retry may succeed, so it
is told UNAVAILABLE, never INTERNAL (the chaos test saw 3 of 6,292 requests end with that
INTERNAL while workers were being killed)."""


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for a domain error; INTERNAL for anything unexpected. An error of a
    call this service made to another passes on as it came (INVALID_ARGUMENT stays the
    caller's to fix), except a failed peer's, which is UNAVAILABLE."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return grpc.StatusCode.UNAVAILABLE if exc.code() in _PEER_FAILURE else exc.code()
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def message_for(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in _PEER_FAILURE:
            return f"a worker failed during the request ({exc.code().name}: {exc.details()}); retry"
        return exc.details() or str(exc.code())
    return str(exc) or type(exc).__name__
