"""Merge several async streams into one, tagged by source, cancelling all on exit or error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar, cast

from pdmesh.rpc.process import cancel_all

T = TypeVar("T")
_DONE = object()


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """``(index of the stream, item)`` as items arrive, until every stream ends. The first
    error from any stream is raised here; leaving early cancels the streams still running."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()  # an item, the error or _DONE

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which re-raises it
            queue.put_nowait((i, exc))
            return
        queue.put_nowait((i, _DONE))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, got = await queue.get()
            if got is _DONE:
                running -= 1
            elif isinstance(got, Exception):
                raise got
            else:
                yield i, cast(T, got)
    finally:
        await cancel_all(tasks)
