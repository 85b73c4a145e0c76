"""A gRPC pass-through in front of a real worker that breaks chosen calls (tests only).

gRPC's core reports some streams broken mid-call as INTERNAL ("Internal error from Core"),
and a killed worker produces that only now and then, so a test cannot cause it on
demand. This proxy forwards every call's bytes to the real worker and back, except the
calls ``breaks`` names, which it ends with INTERNAL before forwarding anything, and the
calls ``breaks_after`` names, whose answer it replaces with INTERNAL (the worker acted;
the caller cannot know), and the calls ``breaks_between`` names, which it ends with
INTERNAL after the worker's first message of several (``PrefillStream``'s first token)
once the worker has answered the rest. It can also play a prefill worker from before
``PrefillStream`` answered twice (a rolling upgrade): for the calls ``answers_once`` names
it drops the first-token answer (``first_only``) and passes the whole one. For the calls
``cuts`` names it plays a connection lost ``cut_delay_s`` after the worker's first message,
the worker alive: the caller's call ends UNAVAILABLE and the worker's is cancelled, as a
broken connection ends both (the worker goes on with what it had in flight). For the calls
``drops_stop`` names it streams the answers through but never passes on a ``stop`` message
(its half-close still goes), as a prefill worker from before ``stop`` reads none.

A call is named by its method and the request id in its first message (the router's id
for that attempt: ``r1`` first, ``r1~1`` for its first retry), not by the order calls
arrive in: the router cancels a request's calls together when one fails, and a call
cancelled at once may or may not reach the proxy on a loaded machine, which shifted
every later ordinal (CI failed on that three times). ``cancel_delay_s`` passes a caller's
cancel on that much later, as a worker busy or far away notices it late.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

from pdmesh.v1 import worker_pb2

_HOP_HEADERS = ("user-agent", "grpc-", ":")
_FIRST_MESSAGE = {"Reserve": worker_pb2.ReserveRequest, "PrefillStream": worker_pb2.PrefillRequest}
"""Method -> the message its call opens with, whose ``request_id`` names the call."""


class BreakingProxy:
    def __init__(self, target: str, breaks: dict[str, set[str]],
                 breaks_after: dict[str, set[str]] | None = None,
                 breaks_between: dict[str, set[str]] | None = None, cancel_delay_s: float = 0.0,
                 answers_once: dict[str, set[str]] | None = None, cuts: dict[str, set[str]] | None = None,
                 cut_delay_s: float = 0.0, drops_stop: dict[str, set[str]] | None = None) -> None:
        self.breaks = breaks
        """Method name (``Reserve``, ``PrefillStream``) -> request ids of its calls to break."""
        self.breaks_after = breaks_after or {}
        """Method name -> request ids of its calls whose answer is replaced with INTERNAL."""
        self.breaks_between = breaks_between or {}
        """Method name -> request ids of its calls broken after the worker's first message."""
        self.cancel_delay_s = cancel_delay_s
        self.answers_once = answers_once or {}
        """Method name (``PrefillStream``) -> request ids of its calls answered once, at the end."""
        self.cuts = cuts or {}
        """Method name -> request ids of its calls cut off after the worker's first message."""
        self.cut_delay_s = cut_delay_s
        self.drops_stop = drops_stop or {}
        """Method name (``PrefillStream``) -> request ids of its calls whose ``stop`` is dropped."""
        self.broken: list[str] = []
        """``"<method> <request id> before|after|between|once|cut|no-stop"`` for each call
        broken (or answered once, or deaf to ``stop``), in order."""
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(target)
        self._server = grpc.server(futures.ThreadPoolExecutor(32), handlers=[_Handler(self)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def breaking(self, table: dict[str, set[str]], name: str, request_id: str, when: str) -> bool:
        """Whether the call of method ``name`` for ``request_id`` is broken ``when``; recorded."""
        if request_id not in table.get(name, ()):
            return False
        with self._lock:
            self.broken.append(f"{name} {request_id} {when}")
        return True

    def forward(self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            yield from self._upstream(method, requests, context)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")

    def cut(self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        """The worker's first message, then the connection lost ``cut_delay_s`` later."""
        call = self._upstream(method, requests, context)
        try:
            yield next(call)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
        time.sleep(self.cut_delay_s)
        call.cancel()
        context.abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")

    def _upstream(self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        """The same call to the worker; the caller's cancel reaches it ``cancel_delay_s`` late."""
        metadata = [(k, v) for k, v in context.invocation_metadata() if not k.startswith(_HOP_HEADERS)]
        call: Any = self._channel.stream_stream(method)(self._late(requests), metadata=metadata,
                                                         timeout=context.time_remaining())
        context.add_callback(lambda: threading.Timer(self.cancel_delay_s, call.cancel).start())
        return call

    def _late(self, requests: Iterator[bytes]) -> Iterator[bytes]:
        """The caller's messages; its cancel reaches the worker ``cancel_delay_s`` late."""
        try:
            yield from requests
        except grpc.RpcError:
            time.sleep(self.cancel_delay_s)
            raise

    def close(self) -> None:
        self._server.stop(grace=None)
        self._channel.close()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: BreakingProxy) -> None:
        self.proxy = proxy

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method  # type: ignore[attr-defined]
        name = method.rsplit("/", 1)[-1]
        proxy = self.proxy

        def handle(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            if name not in _FIRST_MESSAGE:
                yield from proxy.forward(method, requests, context)
                return
            first = next(requests, None)
            if first is None:  # the caller went before it said anything
                return
            request_id = _FIRST_MESSAGE[name].FromString(first).request_id
            if proxy.breaking(proxy.breaks, name, request_id, "before"):
                context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
            if proxy.breaking(proxy.cuts, name, request_id, "cut"):
                yield from proxy.cut(method, itertools.chain([first], requests), context)
                return
            if proxy.breaking(proxy.drops_stop, name, request_id, "no-stop"):
                yield from proxy.forward(method, _without_stop(itertools.chain([first], requests)), context)
                return
            answer = list(proxy.forward(method, itertools.chain([first], requests), context))  # the worker answered
            if proxy.breaking(proxy.breaks_after, name, request_id, "after"):
                context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
            if proxy.breaking(proxy.breaks_between, name, request_id, "between"):
                yield answer[0]
                context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
            if proxy.breaking(proxy.answers_once, name, request_id, "once"):
                answer = [a for a in answer if not worker_pb2.PrefillResponse.FromString(a).first_only]
            yield from answer

        return grpc.stream_stream_rpc_method_handler(handle)


def _without_stop(requests: Iterator[bytes]) -> Iterator[bytes]:
    """``PrefillStream``'s messages less any ``stop``."""
    for msg in requests:
        if not worker_pb2.PrefillRequest.FromString(msg).stop:
            yield msg
