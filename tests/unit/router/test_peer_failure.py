"""A worker that dies mid-call reaches the mesh's client as UNAVAILABLE, never INTERNAL;
inside the mesh the code passes on as it came (the router reads a worker's UNAVAILABLE
as "that worker is down": a prefill worker must not pass a dead decode worker's failure
on as its own)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdmesh.errors import UnavailableError
from pdmesh.rpc.status import PEER_FAILURE, for_client, status_for
from pdmesh.sampling_params import SamplingParams
from services.router.http.errors import status_of


def _peer_error(code: grpc.StatusCode, details: str = "Internal error from Core") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize("code", sorted(PEER_FAILURE, key=lambda c: c.name))
def test_a_failed_peer_is_unavailable_to_the_client(code: grpc.StatusCode) -> None:
    exc = for_client(_peer_error(code))
    assert isinstance(exc, UnavailableError)
    assert str(exc) == f"a worker failed during the request ({code.name}: Internal error from Core); retry"
    assert status_for(exc) is grpc.StatusCode.UNAVAILABLE and status_of(exc).status == 503


def test_inside_the_mesh_a_peer_status_passes_on_as_it_came() -> None:
    assert status_for(_peer_error(grpc.StatusCode.INTERNAL)) is grpc.StatusCode.INTERNAL
    actionable = _peer_error(grpc.StatusCode.INVALID_ARGUMENT, "prompt: too long")
    assert for_client(actionable) is actionable


def test_the_router_tells_its_client_unavailable(llama_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from services.router.config import RouterConfig
    from services.router.registry import Registry
    from services.router.request.completions import Completions
    from services.router.router import Router

    async def broken(self):  # type: ignore[no-untyped-def]  # a downstream stream reset mid-call
        raise _peer_error(grpc.StatusCode.INTERNAL)
        yield

    monkeypatch.setattr(Completions, "stream", broken)
    cfg = RouterConfig(model=str(llama_dir))
    router = Router(cfg, Registry(cfg))

    async def run() -> None:
        async for _ in router.generate("r", [1, 2, 3], SamplingParams(max_tokens=2), deadline=1e12):
            pass

    with pytest.raises(UnavailableError, match=r"a worker failed during the request \(INTERNAL"):
        asyncio.run(run())
    assert router.flows == {}
