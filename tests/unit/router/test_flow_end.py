"""A decode worker that dies after its stream's last message: the request is complete, and
the router must not migrate it (the next worker would refuse resume tokens that already
reach ``max_tokens``). Seen once in CI; the kill cannot be timed that precisely, so the
stream below ends the way such a worker's does."""

from __future__ import annotations

import asyncio

import grpc

from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import common_pb2, generate_pb2


class _DiesAfterLastMessage:
    """A decode stream: two messages, the second with a finish reason, then UNAVAILABLE
    instead of the closing status (the process was killed before its trailers)."""

    def __init__(self) -> None:
        self.messages = [generate_pb2.GenerateResponse(token_ids=[5], text="a"),
                         generate_pb2.GenerateResponse(token_ids=[6], text="b",
                                                       finish_reason=common_pb2.FINISH_REASON_LENGTH)]

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self

    async def __anext__(self) -> generate_pb2.GenerateResponse:
        if self.messages:
            return self.messages.pop(0)
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   "Socket closed")

    def cancel(self) -> bool:
        return False


def test_a_stream_whose_last_message_arrived_is_not_migrated(llama_dir) -> None:  # type: ignore[no-untyped-def]
    from services.router.config import RouterConfig
    from services.router.registry import Registry
    from services.router.request.flow import RequestFlow
    from services.router.router import Router
    from services.router.worker_handle import WorkerHandle

    cfg = RouterConfig(model=str(llama_dir))
    router = Router(cfg, Registry(cfg))  # no decode worker to migrate to: a migration would raise

    async def relay() -> list[generate_pb2.GenerateResponse]:
        flow = RequestFlow(router, "r", [1, 2, 3], SamplingParams(max_tokens=2), deadline=1e12,
                           decode=WorkerHandle("127.0.0.1:1", "decode", healthy=True))  # the registry's none
        got = [resp async for resp in flow._decoded(_DiesAfterLastMessage())]
        assert flow.finished and flow.streamed_tokens == [5, 6]
        return got

    got = asyncio.run(relay())
    assert [list(r.token_ids) for r in got] == [[5], [6]]
    assert router.stats.migrations == 0
