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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdmesh.errors import BindError, InvalidRequestError
from pdmesh.rpc.reflection import enable_reflection
from pdmesh.rpc.status import message_for, status_for
from pdmesh.rpc.tls import TLSFiles
from pdmesh.rpc.tls import configure as configure_tls

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # grpcio ends calls beyond these with a bare CANCELLED (defaults 1,000 / 3,000; the
    # names without "server." are ignored). Admission is the application's job: the router
    # refuses what it cannot queue with RESOURCE_EXHAUSTED and a retry hint.
    ("grpc.server.max_pending_requests", 100_000),
    ("grpc.server.max_pending_requests_hard_limit", 100_000),
    ("grpc.so_reuseport", 0),
    # The mesh's own channels ping twice a second while a call is open (MESH_CHANNEL_OPTIONS);
    # the default would take those pings as abuse and close the connection (GOAWAY).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 250),
    ("grpc.http2.max_ping_strikes", 0),
]
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
KEEPALIVE_S = 1.0
"""A ping unanswered this long closes a mesh connection, and a connection attempt with no
answer within it fails."""
PING_AFTER_S = 0.5
"""A mesh channel with calls open pings its peer after this long without a frame: a stopped
peer is found ``PING_AFTER_S + KEEPALIVE_S`` after its last frame."""
MESH_CHANNEL_OPTIONS = [
    *CHANNEL_OPTIONS,
    # A worker whose process stopped (paused, a host swapping, a dead NIC) keeps its socket:
    # without these a call to it waits for its deadline. With them, every call open on it
    # ends UNAVAILABLE ("ping timeout") ~1.5 s after its last frame, and a new call fails
    # UNAVAILABLE ("timed out before receiving SETTINGS frame") in ~1 s: the router's
    # handling of a worker that died takes over. Pings are answered by gRPC's own threads,
    # so a worker in a long step still answers them. ``ping_timeout_ms`` bounds every ping
    # (keepalive's own timeout never started while a flow-control ping sent just before the
    # stop was still unanswered: 60 s by default); ``min_reconnect_backoff_ms`` is also the
    # connection attempt's deadline.
    ("grpc.keepalive_time_ms", int(PING_AFTER_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.min_reconnect_backoff_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns domain exceptions raised by handlers into precise status codes, and a request
    that does not deserialize into INVALID_ARGUMENT naming its message (grpcio would answer
    UNKNOWN "Unexpected DecodeError" and log a traceback)."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        deserializer = _tolerant(handler.request_deserializer, handler_call_details.method)
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            fn = getattr(handler, kind)
            if fn is not None:
                return handler._replace(**{kind: _wrap(fn)}, request_deserializer=deserializer)
        return handler


class _Malformed:
    """What a request that failed to deserialize becomes; the handler wrapper refuses it."""

    def __init__(self, method: str, error: Exception) -> None:
        self.message = f"malformed request to {method}: {error}"


def _tolerant(deserialize: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # noqa: BLE001 - DecodeError, invalid UTF-8 in a string field ...
            return _Malformed(method, exc)

    return parse


async def read_message(context: grpc.aio.ServicerContext) -> Any:
    """The next message of a client stream (``grpc.aio.EOF`` at its end); one that did not
    deserialize is refused as INVALID_ARGUMENT naming the method."""
    msg = await context.read()
    if isinstance(msg, _Malformed):
        raise InvalidRequestError("request", msg.message)
    return msg


RETRY_AFTER_MS = "1000"
"""Sent as ``retry-after-ms`` trailing metadata with RESOURCE_EXHAUSTED and UNAVAILABLE."""


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    code = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("unexpected error in handler", exc_info=exc)
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        context.set_trailing_metadata((("retry-after-ms", RETRY_AFTER_MS),))
    await context.abort(code, message_for(exc))


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The handler with the error mapping, of the same kind: grpc.aio tells a handler that
    yields its answers (an async generator, as grpcio-reflection's) from one that writes them
    with ``context.write`` (a coroutine, as pdmesh's) by the function's type, and each must
    keep its own (a coroutine wrapper around a generator fails every call with INTERNAL)."""
    return _wrap_generator(fn) if inspect.isasyncgenfunction(fn) else _wrap_coroutine(fn)


def _wrap_coroutine(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapped(request, context):
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            return await fn(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to the caller's gRPC status
            await _abort(context, exc)

    return wrapped


def _wrap_generator(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapped(request, context):
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            async for item in fn(request, context):
                yield item
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to the caller's gRPC status
            await _abort(context, exc)

    return wrapped


class _NotServingYet(health.aio.HealthServicer):
    """grpcio-health-checking's servicer, starting NOT_SERVING (its own starts the whole
    server SERVING): a worker opens its port before its model is loaded, and a probe must
    not see it ready then."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        for name in ["", *names]:  # no watcher can exist yet: set without its condition
            self._server_status[name] = health_pb2.HealthCheckResponse.NOT_SERVING


def create_server(
    address: str, service_names: list[str], max_receive_bytes: int = MAX_MESSAGE_BYTES,
    tls: TLSFiles | None = None, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    require_client_cert: bool = True,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """A bound (not started) server with health (NOT_SERVING) and reflection, over TLS when
    ``tls`` is given (and the process's channels too: ``tls.configure``). A request larger
    than ``max_receive_bytes`` is refused by gRPC (RESOURCE_EXHAUSTED) before it is read
    into memory. ``interceptors`` run before the error mapping (authentication)."""
    options = [o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", max_receive_bytes))
    server = grpc.aio.server(interceptors=[*interceptors, ErrorMappingInterceptor()], options=options)
    configure_tls(tls)
    try:  # grpcio raises RuntimeError where it once returned 0
        port = (server.add_secure_port(address, tls.server_credentials(require_client_cert)) if tls is not None
                else server.add_insecure_port(address))
    except RuntimeError:
        port = 0
    if port == 0:
        raise BindError.at(address)
    health_servicer = _NotServingYet([*service_names])
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection(server, [*service_names, health.SERVICE_NAME])
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
    before_drain: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT, then ``before_drain`` (leave the membership and give routers
    time to notice, still serving), then drain: NOT_SERVING, finish in-flight calls (and
    ``drain_also``'s, e.g. an HTTP front, at the same time), stop, then ``on_stop``."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if before_drain is not None:
        await before_drain()
    log.info("draining (grace %.1fs)", grace)
    await set_serving(health_servicer, names, False)
    await asyncio.gather(server.stop(grace), *([drain_also()] if drain_also is not None else []))
    if on_stop is not None:
        result = on_stop()
        if inspect.isawaitable(result):
            await result
