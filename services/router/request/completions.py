"""A request's ``n`` completions: one ``RequestFlow`` each, merged into one stream.

Completion ``i`` is its own flow (request id ``{id}#{i}`` on the workers, seed ``seed + i``
as the engine seeds its forked completions), so each can land on any worker; the prompt's
blocks are computed once and hit the prefix cache for the others. ``abort`` ends them all.
Both fronts (gRPC and HTTP) read the same ``(index, response)`` stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from services.router.request.flow import RequestFlow
from services.router.request.streams import merge


@dataclass(eq=False)
class Completions:
    request_id: str
    flows: list[RequestFlow]

    def abort(self) -> bool:
        return any([flow.abort() for flow in self.flows])

    async def stream(self) -> AsyncIterator[tuple[int, Any]]:
        """``(completion index, GenerateResponse)`` until every completion has finished."""
        async for item in merge([flow.stream() for flow in self.flows]):
            yield item
