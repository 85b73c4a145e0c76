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


def _feed(delivered_ago: float) -> WorkerFeed:
    """A feed (never opened over gRPC: its subscriptions and its last batch's time are what
    a fed call reads) whose last batch came ``delivered_ago`` seconds ago."""
    feed = WorkerFeed("127.0.0.1:1", "unopened")
    feed.batch_at = asyncio.get_running_loop().time() - delivered_ago
    return feed


async def _collect(queue: asyncio.Queue, lag_s: float, feed: WorkerFeed,  # type: ignore[type-arg]
                   within_s: float = 60.0) -> list[int]:
    tokens: list[int] = []
    deadline = asyncio.get_running_loop().time() + within_s
    async for resp in FedCall(EndedCall(), feed, "r", queue, lag_s, deadline):
        tokens += resp.token_ids
    return tokens


async def _final_after(queue: asyncio.Queue, delay_s: float) -> None:  # type: ignore[type-arg]
    await asyncio.sleep(delay_s)
    queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[3], finish_reason=1))


def test_the_last_message_may_come_after_the_call_ended() -> None:
    async def run() -> list[int]:
        queue: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
        queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[1, 2]))
        task = asyncio.create_task(_final_after(queue, 0.05))
        tokens = await _collect(queue, 2.0, _feed(0.0))
        await task
        return tokens

    assert asyncio.run(run()) == [1, 2, 3]


def test_a_feed_running_behind_its_calls_is_waited_for_past_the_lag() -> None:
    # Under overload the worker ends calls while their last messages still queue for the
    # feed: it keeps delivering other requests' batches, and this one's comes 4 lags late.
    async def run() -> list[int]:
        queue: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
        queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[1, 2]))
        feed = _feed(0.0)

        async def others() -> None:
            while True:
                await asyncio.sleep(0.02)
                feed.batch_at = asyncio.get_running_loop().time()

        ticker, final = asyncio.create_task(others()), asyncio.create_task(_final_after(queue, 0.4))
        try:
            return await _collect(queue, 0.1, feed)
        finally:
            ticker.cancel()
            await final

    assert asyncio.run(run()) == [1, 2, 3]


def test_a_last_message_that_never_comes_is_unavailable_once_the_feed_is_silent() -> None:
    async def run() -> float:
        queue: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
        queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[1]))
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _collect(queue, 0.3, _feed(0.1))  # silent for 0.1 s already: 0.2 s more
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "token feed delivered nothing" in (err.value.details() or "")
        return loop.time() - started

    assert 0.15 <= asyncio.run(run()) < 0.3


def test_a_feed_that_delivers_everything_but_the_last_message_ends_at_the_deadline() -> None:
    async def run() -> float:
        queue: asyncio.Queue = asyncio.Queue()  # type: ignore[type-arg]
        queue.put_nowait(generate_pb2.GenerateResponse(token_ids=[1]))
        feed = _feed(0.0)

        async def others() -> None:
            while True:
                await asyncio.sleep(0.02)
                feed.batch_at = asyncio.get_running_loop().time()

        ticker = asyncio.create_task(others())
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _collect(queue, 0.1, feed, within_s=0.4)
        finally:
            ticker.cancel()
        assert "by the request's deadline" in (err.value.details() or "")
        return loop.time() - started

    assert 0.35 <= asyncio.run(run()) < 0.6
