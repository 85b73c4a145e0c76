"""What one request's steps ask of the router, as an interface: ``Router`` provides it,
and nothing in this package imports it (it creates the flows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pdmesh.kv.block_hash import BlockHash
    from pdmesh.rpc.feed_sink import Feeds
    from pdmesh.sampling_params import SamplingParams
    from pdmesh.telemetry.metrics import RequestMetrics
    from services.router.config import RouterConfig
    from services.router.policies import Decision
    from services.router.prefill_routing import IndexSeen, PrefillRouter
    from services.router.registry import Registry
    from services.router.request.stats import RouterStats
    from services.router.worker_handle import WorkerHandle


class RouterMesh(Protocol):
    cfg: RouterConfig
    workers: Registry
    feeds: Feeds
    """Token feeds from the decode workers (``pdmesh/rpc/feed_sink.py``)."""
    stats: RouterStats
    prefill_router: PrefillRouter
    request_metrics: RequestMetrics
    listed_names: list[str]

    def prompt_hashes(self, ids: list[int], params: SamplingParams) -> list[BlockHash]: ...

    def route_decode(self, hashes: list[BlockHash], exclude: set[str] | frozenset[str] = ...,
                     tokens: int = ...) -> tuple[WorkerHandle, int]: ...

    async def route_prefill(self, ids: list[int], hashes: list[BlockHash], exclude: set[str],
                            ctx: Any = ...) -> tuple[Decision | None, IndexSeen]: ...

    def local_reason(self, choice: Decision | None, ids: list[int], decode_held: int = ...,
                     decode: WorkerHandle | None = ...) -> str: ...

    def settle_route(self, choice: Decision | None, local_reason: str, hashes: list[BlockHash]) -> None: ...
