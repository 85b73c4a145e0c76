"""Errors in OpenAI's JSON shape with the HTTP status a client can act on.

One mapping, from pdmesh's typed errors and from downstream gRPC statuses: bad input 400
(naming the field), unknown model 404, no room 429 with Retry-After, no worker 503, past
the deadline 504. Only a fault of the mesh itself is a 500.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from fastapi.responses import JSONResponse

from pdmesh.errors import (
    CapacityError,
    IncompatibleWorkerError,
    InvalidRequestError,
    TransferFailedError,
    UnavailableError,
    UnsupportedModelError,
)

_GRPC_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.ABORTED: 503,
    grpc.StatusCode.FAILED_PRECONDITION: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 503,
}
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLargeError",
          429: "RateLimitError", 503: "ServiceUnavailableError", 504: "TimeoutError",
          500: "InternalServerError"}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def status_of(exc: BaseException) -> HTTPError:
    """The HTTP error for anything a request can end with."""
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return HTTPError(400, str(exc), exc.field)
    if isinstance(exc, UnsupportedModelError):
        return HTTPError(400, str(exc))
    if isinstance(exc, CapacityError):
        hint = "" if "retry" in str(exc) else "; retry later"
        return HTTPError(429, f"{exc}{hint}", code="resource_exhausted")
    if isinstance(exc, UnavailableError | TransferFailedError | IncompatibleWorkerError):
        return HTTPError(503, str(exc))
    if isinstance(exc, asyncio.TimeoutError) or (
            isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
        # A worker call's own deadline is the request's: gRPC's wording of it ("Stream
        # removed") says nothing a caller can act on.
        return HTTPError(504, "the request did not finish before its deadline (the router's --request-timeout-s)",
                         code="deadline_exceeded")
    if isinstance(exc, grpc.aio.AioRpcError):
        code = _GRPC_STATUS.get(exc.code(), 500)
        return HTTPError(code, exc.details() or exc.code().name, code=exc.code().name.lower())
    return HTTPError(500, f"internal error: {type(exc).__name__}")


def error_body(err: HTTPError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": _TYPES.get(err.status, "APIError"),
                      "param": err.param, "code": err.code if err.code is not None else err.status}}


def error_response(err: HTTPError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status in (429, 503) else None
    return JSONResponse(error_body(err), status_code=err.status, headers=headers)
