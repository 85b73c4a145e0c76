"""``pdmesh.Client`` (blocking) and ``pdmesh.client.AsyncClient`` (asyncio): call a pdmesh
router from Python; tokens stream back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc

from pdmesh.rpc.convert import FINISH_NAMES
from pdmesh.rpc.server import CHANNEL_OPTIONS
from pdmesh.v1 import admin_pb2, admin_pb2_grpc, common_pb2, generate_pb2, generate_pb2_grpc


@dataclass
class Completion:
    request_id: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_draft_tokens: int = 0
    """Speculative decoding: drafts verified for this request, and how many were accepted."""
    spec_accepted_tokens: int = 0


DEFAULT_PORT = 50051
"""The router's gRPC port unless told otherwise (``pdmesh up --port``, the deploy files)."""


def router_address(address: str) -> str:
    """``HOST[:PORT]`` as a gRPC target: the port defaults to ``DEFAULT_PORT`` (a bare
    ``localhost`` would otherwise dial 443), ``[v6]`` literals kept whole."""
    host = address.removeprefix("grpc://").rstrip("/")
    if host.startswith("["):
        return host if "]:" in host else f"{host}:{DEFAULT_PORT}"
    return host if ":" in host else f"{host}:{DEFAULT_PORT}"


Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]
"""Text, token ids, or chat messages (``{"role": ..., "content": ...}``) that the router
renders with the model's chat template."""


def build_request(prompt: Prompt, request_id: str = "", cache_salt: str = "",
                  **sampling: Any) -> generate_pb2.GenerateRequest:
    """A ``GenerateRequest``: text, token ids or chat messages, and ``SamplingParams``
    fields by name."""
    req = generate_pb2.GenerateRequest(
        request_id=request_id, cache_salt=cache_salt, sampling=common_pb2.SamplingParams(**sampling)
    )
    if isinstance(prompt, str):
        req.text = prompt
    elif prompt and isinstance(prompt[0], Mapping):
        messages = cast(Sequence[Mapping[str, str]], prompt)  # the first is a mapping: chat messages
        req.messages.messages.extend(generate_pb2.ChatMessage(role=m["role"], content=m["content"])
                                     for m in messages)
    else:
        req.token_ids.ids.extend(prompt)
    return req


@dataclass(frozen=True)
class Security:
    """How a client reaches a router that uses TLS and / or an API key: ``tls_ca`` verifies
    the router (PEM path), ``tls_cert`` / ``tls_key`` are the client's own certificate when
    the router requires mutual TLS, ``api_key`` is sent as ``authorization: Bearer``."""

    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    api_key: str = ""

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.tls_ca or self.tls_cert):
            return None

        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.tls_ca), read(self.tls_key), read(self.tls_cert))

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()


class AsyncClient:
    """``async with AsyncClient(addr) as c: async for resp in c.generate(prompt, max_tokens=8)``."""

    def __init__(self, address: str, timeout: float = 600.0, security: Security | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self.security = security or Security()
        creds = self.security.credentials()
        self._channel = (grpc.aio.secure_channel(address, creds, options=CHANNEL_OPTIONS) if creds
                         else grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS))
        self._stub = generate_pb2_grpc.GenerationStub(self._channel)

    async def generate(self, prompt: Prompt, timeout: float | None = None, **kwargs: Any
                       ) -> AsyncIterator[generate_pb2.GenerateResponse]:
        """Stream responses; raises ``grpc.aio.AioRpcError`` with the mesh's status on failure."""
        call = self._stub.Generate(build_request(prompt, **kwargs), timeout=timeout or self.timeout,
                                   metadata=self.security.metadata)
        try:
            async for resp in call:
                yield resp
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Client:
    """``Client("127.0.0.1:50051").complete("def main():", max_tokens=32, temperature=0)``."""

    def __init__(self, address: str, timeout: float = 600.0, security: Security | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self.security = security or Security()
        creds = self.security.credentials()
        self._channel = (grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS) if creds
                         else grpc.insecure_channel(address, options=CHANNEL_OPTIONS))
        self._stub = generate_pb2_grpc.GenerationStub(self._channel)

    def request(self, prompt: Prompt, request_id: str = "", cache_salt: str = "",
                **sampling: Any) -> generate_pb2.GenerateRequest:
        return build_request(prompt, request_id, cache_salt, **sampling)

    def stream(self, prompt: Prompt, timeout: float | None = None, **kwargs: Any) -> Any:
        """The ``Generate`` call itself: iterate it for the responses, ``cancel()`` it to leave
        early (the router then aborts the request and frees its blocks everywhere)."""
        return self._stub.Generate(self.request(prompt, **kwargs), timeout=timeout or self.timeout,
                                   metadata=self.security.metadata)

    def generate(self, prompt: Prompt, timeout: float | None = None, **kwargs: Any
                 ) -> Iterator[generate_pb2.GenerateResponse]:
        """Stream responses; raises ``grpc.RpcError`` with the mesh's status code on failure."""
        yield from self._stub.Generate(self.request(prompt, **kwargs), timeout=timeout or self.timeout,
                                       metadata=self.security.metadata)

    def complete(self, prompt: Prompt, timeout: float | None = None, **kwargs: Any) -> Completion:
        """The whole completion (``n`` = 1; see ``complete_n``)."""
        return self.complete_n(prompt, timeout=timeout, **kwargs)[0]

    def complete_n(self, prompt: Prompt, timeout: float | None = None, **kwargs: Any
                   ) -> list[Completion]:
        """Every completion of the request (``n=N`` in ``kwargs``), in index order."""
        outs = [Completion() for _ in range(int(kwargs.get("n", 1)))]
        for resp in self.generate(prompt, timeout=timeout, **kwargs):
            out = outs[resp.index]
            out.request_id = resp.request_id or out.request_id
            out.text += resp.text
            out.token_ids.extend(resp.token_ids)
            if resp.finish_reason:
                out.finish_reason = FINISH_NAMES[resp.finish_reason]
                out.stop_reason = resp.stop_reason
                out.prompt_tokens = resp.usage.prompt_tokens
                out.completion_tokens = resp.usage.completion_tokens
                out.cached_tokens = resp.usage.cached_tokens
                out.spec_draft_tokens = resp.usage.spec_draft_tokens
                out.spec_accepted_tokens = resp.usage.spec_accepted_tokens
        return outs

    def abort(self, request_id: str) -> bool:
        return self._stub.Abort(generate_pb2.AbortRequest(request_id=request_id), timeout=10,
                                metadata=self.security.metadata).aborted

    def tokenize(self, text: str) -> list[int]:
        return list(self._stub.Tokenize(generate_pb2.TokenizeRequest(text=text), timeout=10,
                                        metadata=self.security.metadata).token_ids)

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        req = generate_pb2.DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        return self._stub.Detokenize(req, timeout=10, metadata=self.security.metadata).text

    def list_workers(self) -> admin_pb2.ListWorkersResponse:
        """The router's view of its workers and the prefix index (``MeshAdmin.ListWorkers``)."""
        return admin_pb2_grpc.MeshAdminStub(self._channel).ListWorkers(
            admin_pb2.ListWorkersRequest(), timeout=10, metadata=self.security.metadata)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
