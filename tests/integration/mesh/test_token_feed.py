"""Token feeds between the router and a decode worker (pdmesh/rpc/feed_source.py and
feed_sink.py): tokens equal to those of a call without a feed, the router's requests on
the feed once it is open, a call naming a feed the worker does not hold streamed on the
call itself (and counted), and a feed that breaks mid-request failing that request with
UNAVAILABLE and leaving no block behind."""

from __future__ import annotations

import asyncio
import random
import time

import grpc
import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from pdmesh.rpc import messages
from pdmesh.rpc.clients import decode_stub
from pdmesh.rpc.feed_sink import FedCall, Feeds
from pdmesh.sampling_params import SamplingParams
from pdmesh.telemetry.scrape import scrape, total
from pdmesh.v1 import worker_pb2
from tests.integration.mesh_tools import wait_idle


def _prompt(seed: int, n: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 1000) for _ in range(n)]


def _local(rid: str, prompt: list[int], max_tokens: int) -> worker_pb2.ReserveRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return messages.reserve_request(rid, prompt, params, lease_ms=10_000)


async def _open(feeds: Feeds, address: str) -> None:
    """Open ``feeds``' stream to ``address`` (the first call goes without it)."""
    tokens = [t async for r in feeds.start(address, "GenerateLocal", _local("warm", _prompt(1), 2), None, 30)
              for t in r.token_ids]
    assert len(tokens) == 2
    deadline = time.monotonic() + 10
    while not feeds.is_open(address):
        assert time.monotonic() < deadline, "the feed did not open"
        await asyncio.sleep(0.02)


def test_a_feed_carries_the_same_tokens_as_the_call(mesh: Mesh) -> None:
    address = mesh.decode[0].address

    async def run() -> tuple[list[int], list[int], int]:
        plain = [t async for r in Feeds(enabled=False).start(address, "GenerateLocal", _local("plain", _prompt(2), 24),
                                                             None, 30) for t in r.token_ids]
        feeds = Feeds()
        await _open(feeds, address)
        call = feeds.start(address, "GenerateLocal", _local("fed", _prompt(2), 24), None, 30)
        assert isinstance(call, FedCall)
        fed, last = [], None
        async for resp in call:
            fed += resp.token_ids
            last = resp
        assert last is not None and last.finish_reason and last.usage.completion_tokens == 24
        await feeds.close()
        return plain, fed, feeds.fed

    plain, fed, n_fed = asyncio.run(run())
    assert len(plain) == 24 and fed == plain and n_fed == 1


def test_a_call_naming_a_feed_not_open_streams_on_the_call(mesh: Mesh) -> None:
    decode = mesh.decode[0]
    before = total(scrape(decode.metrics_address), "pdmesh_feed_misses_total")

    async def run() -> list[int]:
        msg = _local("unknown-feed", _prompt(3), 8)
        msg.feed_id = "no-such-feed"
        return [t async for r in decode_stub(decode.address).GenerateLocal(msg, timeout=30) for t in r.token_ids]

    assert len(asyncio.run(run())) == 8
    assert total(scrape(decode.metrics_address), "pdmesh_feed_misses_total") == before + 1


def test_a_feed_that_breaks_fails_its_requests_and_frees_their_blocks(mesh: Mesh) -> None:
    address = mesh.decode[0].address

    async def run() -> grpc.StatusCode:
        feeds = Feeds()
        await _open(feeds, address)
        call = feeds.start(address, "GenerateLocal", _local("broken-feed", _prompt(4, 100), 400), None, 60)
        assert isinstance(call, FedCall)
        messages_seen, other = 0, None
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                messages_seen += 1
                if messages_seen == 3:  # a second feed with the same id replaces (ends) ours
                    other = decode_stub(address).Feed(worker_pb2.FeedRequest(feed_id=feeds.feed_id))
                    await other.read()
        call.cancel()  # as the router does when it leaves a request
        assert other is not None
        other.cancel()
        await feeds.close()
        return err.value.code()

    assert asyncio.run(run()) == grpc.StatusCode.UNAVAILABLE
    wait_idle(mesh)


def test_the_routers_requests_travel_on_the_feed(mesh: Mesh, client: Client) -> None:
    router = mesh.router
    assert router is not None
    before = scrape(router.metrics_address)
    n = 6
    for i in range(n):
        assert len(client.complete(_prompt(10 + i), max_tokens=6, temperature=0, ignore_eos=True).token_ids) == 6
        time.sleep(0.05)
    after = scrape(router.metrics_address)

    def calls(path: str) -> float:
        return total(after, "pdmesh_decode_calls_total", path=path) - total(before, "pdmesh_decode_calls_total",
                                                                          path=path)

    fed, unfed = calls("feed"), calls("call")
    assert fed + unfed == n and fed >= n - 1  # the first may come before the feed is open
