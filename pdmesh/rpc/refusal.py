"""A handler that refuses every call with one status, in the shape of the handler it
replaces (interceptors that turn calls away: authentication, a server still starting)."""

from __future__ import annotations

from typing import Any

import grpc


def refusing(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """``handler``'s kind (unary or streaming, each way) answering ``code``: grpc.aio
    calls a handler by its kind, so a unary refusal in place of a stream would fail."""
    if handler is None:
        return None

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    kinds = {"unary_unary": (grpc.unary_unary_rpc_method_handler, unary),
             "unary_stream": (grpc.unary_stream_rpc_method_handler, stream),
             "stream_unary": (grpc.stream_unary_rpc_method_handler, unary),
             "stream_stream": (grpc.stream_stream_rpc_method_handler, stream)}
    for kind, (make, fn) in kinds.items():
        if getattr(handler, kind) is not None:
            return make(fn, handler.request_deserializer, handler.response_serializer)
    return None
