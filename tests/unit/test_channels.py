"""A gRPC aio channel is bound to the event loop it was made on: the cache hands each loop
its own (a tool that runs ``asyncio.run`` twice, such as ``pdmesh bench mesh`` reading
workers' counters before and after a workload, got the first loop's closed channel)."""

from __future__ import annotations

import asyncio

from pdmesh.rpc.clients import channel


def test_one_channel_per_address_and_event_loop() -> None:
    async def pair() -> tuple[object, object, object]:
        return channel("127.0.0.1:1"), channel("127.0.0.1:1"), channel("127.0.0.1:2")

    a1, a2, b = asyncio.run(pair())
    assert a1 is a2 and a1 is not b
    again, _, _ = asyncio.run(pair())
    assert again is not a1
