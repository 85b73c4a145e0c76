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


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for a domain error; INTERNAL for anything unexpected."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def message_for(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.details() or str(exc.code())
    return str(exc) or type(exc).__name__
