"""The OpenAI-compatible HTTP API (FastAPI), served by the router process on its own loop.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses``,
``GET /v1/models``, ``GET /health`` (200 only when the mesh can serve), ``POST /tokenize``,
``POST /detokenize``, ``GET /metrics`` (the router's Prometheus registry). With an API key, every ``/v1/*`` route
wants ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from pdmesh.errors import InvalidRequestError, PdmeshError
from pdmesh.structured.spec import StructuredOutput
from services.router.http import convert, structured
from services.router.http import responses as responses_api
from services.router.http.errors import HTTPError, error_response, status_of
from services.router.http.generation import Generation, Kind
from services.router.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from services.router.reasoning import thinking_of
from services.router.router import Router
from services.router.tools.calls import ToolPlan
from services.router.tools.calls import plan as plan_tools


def _validation_error(exc: RequestValidationError) -> HTTPError:
    first = exc.errors()[0] if exc.errors() else {}
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidRequestError):  # raised by a schema's own check, naming its field
        return HTTPError(400, str(cause), cause.field)
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return HTTPError(400, f"the body is not valid JSON: {first.get('msg', '')}")
    param = ".".join(loc) or None
    return HTTPError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param)


class Gate:
    """Refuses, before the body is read, a body over the limit (413) and a ``/v1/*`` request
    without the API key (401).

    A plain ASGI middleware, not ``@app.middleware("http")``: Starlette's
    ``BaseHTTPMiddleware`` relays every chunk of a streamed response through an extra
    task and memory stream, and with one SSE chunk per token that relay was among the
    router's busiest code under load (docs/performance/log.md, section 16).
    """

    def __init__(self, app: Any, limit: int, api_key: str) -> None:
        self.app, self.limit, self.api_key = app, limit, api_key

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: dict[str, Any]) -> HTTPError | None:
        headers = dict(scope.get("headers") or ())
        size = headers.get(b"content-length", b"").decode("latin-1")
        if size.isdigit() and int(size) > self.limit:
            return HTTPError(413, f"the body has {int(size)} bytes; at most {self.limit} "
                                  "(--max-request-mb) are read", code="request_too_large")
        if (self.api_key and scope.get("path", "").startswith("/v1/")
                and headers.get(b"authorization", b"").decode("latin-1") != f"Bearer {self.api_key}"):
            return HTTPError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                             code="invalid_api_key")
        return None


def create_app(router: Router, api_key: str = "") -> FastAPI:
    app = FastAPI(title="pdmesh", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def framework(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own refusals (a body it cannot parse, an unknown route, a wrong
        # method) in OpenAI's error shape like every other error, not {"detail": ...}.
        response = error_response(HTTPError(exc.status_code, str(exc.detail)))
        response.headers.update(exc.headers or {})  # a 405's Allow
        return response

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return error_response(status_of(exc))

    # Every error a request can end with, mapped once (errors.py); anything else is a 500.
    for kind in (HTTPError, PdmeshError, grpc.aio.AioRpcError, TimeoutError, Exception):
        app.add_exception_handler(kind, failed)

    app.add_middleware(Gate, limit=int(router.cfg.max_request_mb * 2**20), api_key=api_key)
    _add_generation_routes(app, router)
    _add_utility_routes(app, router)
    return app


def _add_generation_routes(app: FastAPI, router: Router) -> None:
    async def start(gen: Generation, source: str) -> tuple[Any, AsyncIterator[Any]]:
        """The generation's first item (or its first error, before any status goes out)
        and the rest."""
        try:  # compiled here first, so a bad schema is refused with the field the body used
            await router.check_structured(gen.params)
        except InvalidRequestError as exc:
            raise structured.renamed(exc, source) from None
        items = gen.stream()
        try:
            return await anext(items, None), items
        except BaseException:
            await items.aclose()
            raise

    async def run(gen: Generation, stream: bool, source: str) -> Response:
        first, items = await start(gen, source)
        if stream:
            return StreamingResponse(gen.sse(first, items), media_type="text/event-stream")
        return JSONResponse(await gen.collect(first, items))

    def generation(kind: Kind, req: CompletionRequest | ChatCompletionRequest,
                   prompts: list[tuple[str | None, list[int]]], max_tokens: int | None,
                   logprobs: int | None, spec: StructuredOutput | None, tools: ToolPlan | None = None
                   ) -> Generation:
        limit = router.model_config.max_position_embeddings
        longest = max(len(ids) for _, ids in prompts)
        params = convert.sampling(req, max_tokens or max(1, limit - longest), logprobs, spec,
                                  keep_special_tokens=tools is not None and tools.keeps_special_tokens)
        for _, ids in prompts:
            router.check_length(ids, params)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return Generation(router, kind, req.request_id or f"{prefix}-{uuid.uuid4().hex}",
                          req.model or router.listed_names[0], prompts,
                          params, echo=getattr(req, "echo", False),
                          include_usage=bool(req.stream_options and req.stream_options.include_usage),
                          return_token_ids=req.return_token_ids, tools=tools,
                          show_prompt_logprobs=req.prompt_logprobs is not None,
                          reasoning=(router.cfg.reasoning_parser or None) if kind == "chat" else None)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        convert.check_model(router, req.model)
        spec, source = structured.requested(req)
        prompts = await convert.completion_prompts(router, req)
        return await run(generation("completion", req, prompts, req.max_tokens or 16, req.logprobs, spec),
                         req.stream, source)

    async def chat_generation(req: ChatCompletionRequest) -> tuple[Generation, str]:
        """A chat request as a generation, and the field its output constraint came from."""
        convert.check_model(router, req.model)
        spec, source = structured.requested(req)
        tools = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, router.cfg.tool_call_parser)
        if tools is not None and tools.structured is not None:
            if spec is not None:
                raise InvalidRequestError(source, f"tool_choice {req.tool_choice!r} already fixes the output's "
                                          f"shape; leave {source} unset")
            spec, source = tools.structured, tools.source
        parser = router.cfg.reasoning_parser or None
        if spec is not None and parser is not None:  # the constraint is on the answer, after the thinking
            spec = dataclasses.replace(spec, thinking=thinking_of(parser))
        ids = await convert.chat_prompt(router, req.messages, req.add_generation_prompt,
                                        tools.tools if tools is not None else None)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        gen = generation("chat", req, [(None, ids)], req.max_completion_tokens or req.max_tokens, logprobs,
                         spec, tools)
        return gen, source

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> Response:
        gen, source = await chat_generation(req)
        return await run(gen, req.stream, source)

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest) -> Response:
        """OpenAI's Responses API over the chat path: the same generation, another shape."""
        gen, source = await chat_generation(responses_api.as_chat(req))
        first, items = await start(gen, source)
        reply = responses_api.Reply(req, gen)
        if req.stream:
            return StreamingResponse(reply.events(first, items), media_type="text/event-stream")
        return JSONResponse(reply.body(await gen.collect(first, items)))


def _add_utility_routes(app: FastAPI, router: Router) -> None:
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "pdmesh",
            "root": router.cfg.model, "max_model_len": router.model_config.max_position_embeddings,
        } for name in router.listed_names]}

    @app.get("/health")
    async def health() -> Response:
        why = router.unservable()
        if why:
            return error_response(HTTPError(503, why))
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        convert.check_model(router, req.model)
        if req.messages is not None:
            ids = await convert.chat_prompt(router, req.messages, req.add_generation_prompt)
        elif req.prompt is not None:
            ids = await router.tokenize(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            raise HTTPError(400, "set prompt or messages", "prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": router.model_config.max_position_embeddings}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        convert.check_model(router, req.model)
        ids = router.prompt_ids(req.tokens) if req.tokens else []
        return {"prompt": router.tokenizer.decode(ids, skip_special_tokens=False)}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics), media_type=CONTENT_TYPE_LATEST)
