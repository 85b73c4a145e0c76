"""``pdmesh.rpc.feed_sink.FedCall``: the order rules between a fed call and its feed, with a
call that cannot be made to misbehave on purpose over real gRPC (a stand-in that yields
what a finished call yields: nothing, then its end) and a real queue as the feed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from pdmesh.rpc.feed_sink import FedCall, WorkerFeed
from pdmesh.v1 import generate_pb2


class EndedCall:
    """A fed call that ended with OK (its messages went on the feed)."""

    def __aiter__(self) -> AsyncIterator[generate_pb2.GenerateResponse]:
        return self._none()

    async def _none(self) -> AsyncIterator[generate_pb2.GenerateResponse]:
        return
        yield


async def _collect(queue: asyncio.Queue, lag_s: float) -> list[int]:  # type: ignore[type-arg]
    tokens: list[int] = []
    feed = WorkerFeed("127.0.0.1:1", "unopened")  # never opened: only its subscriptions are used
    async for resp in FedCall(EndedCall(), feed, "r", queue, lag_s):
        tokens += resp.token_ids
    return tokens


def test_the_last_message_may_come_after_the_call_ended() -> None:
    async def run() -> list[int]:
        queue: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
        queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[1, 2]))

        async def late() -> None:
            await asyncio.sleep(0.05)
            queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[3], finish_reason=1))

        task = asyncio.create_task(late())
        tokens = await _collect(queue, lag_s=2.0)
        await task
        return tokens

    assert asyncio.run(run()) == [1, 2, 3]


def test_a_last_message_that_never_comes_is_unavailable_after_the_lag() -> None:
    async def run() -> None:
        queue: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
        queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[1]))
        await _collect(queue, lag_s=0.1)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(run())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "token feed" in (err.value.details() or "")
