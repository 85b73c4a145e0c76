"""``PrefillStream`` (the router's hand-off: the prompt computes while the decode worker
reserves, the destination follows): a stream whose second message does not carry the
destination, or that ends after the request, is refused with INVALID_ARGUMENT naming
what was missing, and the prefill worker keeps no block of it."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from pdmesh.launcher import Mesh
from pdmesh.rpc import messages
from pdmesh.rpc.clients import prefill_stub
from pdmesh.sampling_params import SamplingParams
from pdmesh.v1 import worker_pb2
from tests.integration.mesh.conftest import wait_idle


@pytest.mark.parametrize("second", ["empty", "none"])
def test_a_stream_without_its_destination_is_refused(mesh: Mesh, second: str) -> None:
    rng = random.Random(7)
    prompt = [rng.randrange(5, 1000) for _ in range(100)]

    async def run() -> grpc.aio.AioRpcError:
        call = prefill_stub(mesh.prefill[0].address).PrefillStream(timeout=30)
        await call.write(messages.prefill_request(f"no-dest-{second}", prompt, SamplingParams(max_tokens=4), None))
        if second == "empty":
            await call.write(worker_pb2.PrefillRequest(request_id=f"no-dest-{second}"))
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        return err.value

    err = asyncio.run(run())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "destination" in (err.details() or "")
    wait_idle(mesh)
