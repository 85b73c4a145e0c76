"""One function builds every pdmesh gRPC server: health, reflection, error mapping, limits, drain.

``create_server`` binds and returns ``(server, port, health)``; the caller adds servicers
before ``start``. Health starts NOT_SERVING and the caller flips it when warm. ``serve_until_signal``
turns SIGTERM/SIGINT into: NOT_SERVING → stop accepting → drain in-flight calls for
``grace`` seconds → stop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pdmesh.rpc.status import message_for, status_for

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Many concurrent streams are normal for a router; the default cancels some past ~1k.
    ("grpc.max_pending_requests", 0),
    ("grpc.so_reuseport", 0),
]
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns domain exceptions raised by handlers into precise status codes."""

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream))
        return handler


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    code = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("unexpected error in handler", exc_info=exc)
    await context.abort(code, message_for(exc))


def _wrap_unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapped(request, context):  # type: ignore[no-untyped-def]
        try:
            return await fn(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapped


def _wrap_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapped(request, context):  # type: ignore[no-untyped-def]
        try:
            gen = fn(request, context)
            if inspect.isasyncgen(gen):
                async for item in gen:
                    yield item
            else:
                await gen
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapped


def create_server(
    address: str, service_names: list[str]
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """A bound (not started) server with health (NOT_SERVING) and reflection."""
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()], options=SERVER_OPTIONS)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    return server, port, health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, names: list[str], serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ["", *names]:
        await health_servicer.set(name, status)


async def serve_until_signal(
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    names: list[str],
    grace: float,
    on_stop: Callable[[], Any] | None = None,
    drain_also: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT, then drain: NOT_SERVING, finish in-flight calls (and
    ``drain_also``'s, e.g. an HTTP front, at the same time), stop, then ``on_stop``."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining (grace %.1fs)", grace)
    await set_serving(health_servicer, names, False)
    await asyncio.gather(server.stop(grace), *([drain_also()] if drain_also is not None else []))
    if on_stop is not None:
        result = on_stop()
        if inspect.isawaitable(result):
            await result
