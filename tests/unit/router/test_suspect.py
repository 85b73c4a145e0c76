"""A request's failure asks the worker for its Info (``Registry.suspect``) instead of
marking it down: an unreachable worker goes down at once, a live one stays in service
(that side runs on a real mesh in tests/integration/failover/test_transfer_failure.py)."""

from __future__ import annotations

import asyncio
import socket

from services.router.config import RouterConfig
from services.router.registry import Registry


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_suspect_that_is_unreachable_goes_down_at_once(llama_dir) -> None:  # type: ignore[no-untyped-def]
    address = f"127.0.0.1:{_closed_port()}"
    cfg = RouterConfig(model=str(llama_dir), decode=[address], down_after_failures=3)
    registry = Registry(cfg)
    (worker,) = registry.workers
    worker.healthy = True

    async def go() -> int:
        registry.suspect(worker)
        registry.suspect(worker)  # a burst's failures share one probe
        probes = len(registry._probes)
        await asyncio.wait_for(asyncio.gather(*registry._probes.values()), timeout=10)
        return probes

    assert asyncio.run(go()) == 1
    assert not worker.healthy  # on the first failed probe, not the third Info call
    assert worker.failures == 1 and registry._probes == {}
