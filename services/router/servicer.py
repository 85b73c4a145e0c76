"""The router's public ``Generation`` service and its ``MeshAdmin`` view: thin adapters.

``Generate`` converts the request once (prompt, sampling params, deadline) and streams what
``Router.generate`` yields (one ``RequestFlow`` per completion; ``flow.py`` holds the
lifecycle); ``Abort`` asks the request's flows to cancel their current downstream calls.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc

from pdmesh.errors import InvalidRequestError
from pdmesh.rpc.convert import info_to_proto, sampling_from_proto
from pdmesh.rpc.process import remaining
from pdmesh.telemetry import tracing
from pdmesh.v1 import admin_pb2, admin_pb2_grpc, generate_pb2, generate_pb2_grpc
from services.router.router import Router

SERVICES = ["pdmesh.v1.Generation", "pdmesh.v1.MeshAdmin"]


async def _prompt_ids(router: Router, request: generate_pb2.GenerateRequest) -> list[int]:
    kind = request.WhichOneof("input")
    if kind == "text":
        return await router.tokenize(request.text)
    if kind == "token_ids":
        return router.prompt_ids(list(request.token_ids.ids))
    if kind == "messages":
        chat = request.messages
        add = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        return await router.chat_ids([{"role": m.role, "content": m.content} for m in chat.messages], add)
    raise InvalidRequestError("input", "set one of text, token_ids or messages")


class GenerationServicer(generate_pb2_grpc.GenerationServicer):
    def __init__(self, router: Router) -> None:
        self.router = router

    async def Generate(self, request, context) -> AsyncIterator[generate_pb2.GenerateResponse]:  # noqa: N802
        router = self.router
        rid = request.request_id or uuid.uuid4().hex
        ids = await _prompt_ids(router, request)
        params = sampling_from_proto(request.sampling, cache_salt=request.cache_salt or None)
        router.check_length(ids, params)
        deadline = asyncio.get_running_loop().time() + remaining(context, router.cfg.request_timeout_s)
        async for index, resp in router.generate(rid, ids, params, deadline, tracing.incoming(context)):
            resp.index = index
            resp.request_id = rid
            yield resp

    async def Abort(self, request, context) -> generate_pb2.AbortResponse:  # noqa: N802
        # Cancel the request's current downstream call, never the handler task: cancelling
        # a task suspended inside gRPC's own send path could leave its stream unfinished.
        flow = self.router.flows.get(request.request_id)
        return generate_pb2.AbortResponse(aborted=flow is not None and flow.abort())

    async def Tokenize(self, request, context) -> generate_pb2.TokenizeResponse:  # noqa: N802
        ids = await self.router.tokenize(request.text) if request.text else []
        return generate_pb2.TokenizeResponse(token_ids=ids)

    async def Detokenize(self, request, context) -> generate_pb2.DetokenizeResponse:  # noqa: N802
        ids = self.router.prompt_ids(list(request.token_ids))
        return generate_pb2.DetokenizeResponse(
            text=self.router.tokenizer.decode(ids, skip_special_tokens=request.skip_special_tokens))

    async def ListModels(self, request, context) -> generate_pb2.ListModelsResponse:  # noqa: N802
        dtype = next((w.info.dtype for w in self.router.workers.workers if w.info is not None), "")
        return generate_pb2.ListModelsResponse(models=[
            generate_pb2.ModelCard(name=name, max_model_len=self.router.model_config.max_position_embeddings,
                                   dtype=dtype)
            for name in self.router.listed_names])


class MeshAdminServicer(admin_pb2_grpc.MeshAdminServicer):
    def __init__(self, router: Router) -> None:
        self.router = router

    async def ListWorkers(self, request, context) -> admin_pb2.ListWorkersResponse:  # noqa: N802
        out = admin_pb2.ListWorkersResponse(index=self.router.prefill_router.health())
        for w in self.router.workers.workers:
            status = out.workers.add(address=w.address, healthy=w.healthy, refused_reason=w.refused,
                                     in_flight=w.in_flight, role=w.role, state=w.state, joined=w.joined,
                                     member=w.member)
            if w.info is not None:
                status.info.CopyFrom(info_to_proto(w.info))
        return out

    async def RouterStats(self, request, context) -> admin_pb2.RouterStatsResponse:  # noqa: N802
        c = self.router
        return admin_pb2.RouterStatsResponse(
            decisions=dict(c.stats.decisions), local_prefills=c.stats.local_prefills,
            index_fallbacks=c.prefill_router.index_fallbacks, prefill_retries=c.stats.prefill_retries,
            decode_migrations=c.stats.migrations, refused=c.admission.refused,
        )


def add_to_server(server: grpc.aio.Server, router: Router) -> None:
    generate_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(router), server)
    admin_pb2_grpc.add_MeshAdminServicer_to_server(MeshAdminServicer(router), server)
