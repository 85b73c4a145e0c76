"""A gRPC pass-through in front of a real worker that breaks chosen calls (tests only).

gRPC's core reports some streams broken mid-call as INTERNAL ("Internal error from Core"),
and a killed worker produces that only now and then, so a test cannot cause it on
demand. This proxy forwards every call's bytes to the real worker and back, except the
calls of a method whose ordinals ``breaks`` names (1 = its first call to arrive), which
it ends with INTERNAL before forwarding anything, and the answers ``breaks_after`` names
(1 = the method's first call the worker answered), which it replaces with INTERNAL (the
worker acted; the caller cannot know). Answers are counted, not calls, because a call
the caller cancels at once (a prefill call whose Reserve failed) may or may not reach
the proxy on a loaded machine, and arrival ordinals after it shifted (CI failed on that
twice); such a call is never answered. ``cancel_delay_s`` passes a caller's cancel on that much later, as a worker
busy or far away notices it late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

_HOP_HEADERS = ("user-agent", "grpc-", ":")


class BreakingProxy:
    def __init__(self, target: str, breaks: dict[str, set[int]],
                 breaks_after: dict[str, set[int]] | None = None, cancel_delay_s: float = 0.0) -> None:
        self.breaks = breaks
        """Method name (``Reserve``, ``PrefillStream``, ...) -> ordinals of its calls to break."""
        self.breaks_after = breaks_after or {}
        """Method name -> ordinals of its answers to replace with INTERNAL."""
        self.cancel_delay_s = cancel_delay_s
        self.calls: dict[str, int] = {}
        self.answers: dict[str, int] = {}
        self.broken: list[str] = []
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(target)
        self._server = grpc.server(futures.ThreadPoolExecutor(32), handlers=[_Handler(self)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def breaks_call(self, name: str) -> bool:
        """Whether this arriving call of method ``name`` is broken before it is forwarded."""
        return self._count(self.calls, self.breaks, name, "before")

    def breaks_answer(self, name: str) -> bool:
        """Whether this answer of method ``name`` is replaced with INTERNAL."""
        return self._count(self.answers, self.breaks_after, name, "after")

    def _count(self, seen: dict[str, int], table: dict[str, set[int]], name: str, when: str) -> bool:
        with self._lock:
            seen[name] = seen.get(name, 0) + 1
            if seen[name] not in table.get(name, ()):
                return False
            self.broken.append(f"{name} {when}")
            return True

    def forward(self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        metadata = [(k, v) for k, v in context.invocation_metadata() if not k.startswith(_HOP_HEADERS)]
        call: Any = self._channel.stream_stream(method)(self._late(requests), metadata=metadata,
                                                         timeout=context.time_remaining())
        context.add_callback(lambda: threading.Timer(self.cancel_delay_s, call.cancel).start())
        try:
            yield from call
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")

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

        def handle(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            if self.proxy.breaks_call(name):
                context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
            if name not in self.proxy.breaks_after:
                yield from self.proxy.forward(method, requests, context)
                return
            answer = list(self.proxy.forward(method, requests, context))  # the worker answered
            if self.proxy.breaks_answer(name):
                context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
            yield from answer

        return grpc.stream_stream_rpc_method_handler(handle)
