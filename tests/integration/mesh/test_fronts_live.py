"""What a load balancer, a Kubernetes probe and an over-eager client see from a live mesh:
HTTP ``/health`` 200, gRPC health per service, ``pdmesh probe`` as typed, and the HTTP
front's 429 (no room, with Retry-After) and 504 (past the router's deadline)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdmesh.client import Client
from pdmesh.launcher import Mesh, free_port
from tests.integration.mesh_tools import start_router, wait_idle

REQUEST_TIMEOUT_S = 0.5
"""The tight router's deadline for a request: a fifth of what 2,000 tokens take here (2.3 s on
a 2-core machine)."""


def test_http_health_is_200_on_a_serving_mesh(mesh: Mesh) -> None:
    with urllib.request.urlopen(mesh.http_url + "/health", timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.parametrize(("service", "process"), [
    ("", "router"), ("pdmesh.v1.Generation", "router"), ("pdmesh.v1.MeshAdmin", "router"),
    ("pdmesh.v1.Prefill", "prefill"), ("pdmesh.v1.Decode", "decode"), ("pdmesh.v1.Worker", "decode"),
])
def test_grpc_health_answers_per_service(mesh: Mesh, service: str, process: str) -> None:
    address = {"router": mesh.router_address, "prefill": mesh.prefill[0].address,
               "decode": mesh.decode[0].address}[process]
    with grpc.insecure_channel(address) as ch:
        got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert got.status == health_pb2.HealthCheckResponse.SERVING


def test_grpc_health_of_a_service_a_process_does_not_serve_is_not_found(mesh: Mesh) -> None:
    with grpc.insecure_channel(mesh.prefill[0].address) as ch, pytest.raises(grpc.RpcError) as err:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="pdmesh.v1.Decode"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_pdmesh_probe_as_typed(mesh: Mesh) -> None:
    def probe(address: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pdmesh", "probe", address], capture_output=True, text=True,
                              timeout=60)

    ok = probe(mesh.decode[0].address)
    assert ok.returncode == 0 and ok.stdout.strip() == f"{mesh.decode[0].address}: SERVING", ok
    nobody = f"127.0.0.1:{free_port()}"
    down = probe(nobody)
    assert down.returncode == 1 and down.stdout.startswith(f"{nobody}: ") and "SERVING" not in down.stdout, down


@pytest.fixture(scope="module")
def tight(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A second router with room for one request, no queue, and a 0.5 s deadline: (its gRPC
    address, its HTTP URL)."""
    tmp = tmp_path_factory.mktemp("tight")
    proc, address = start_router(mesh, tmp, "--max-in-flight", "1", "--max-queued", "0",
                                 "--request-timeout-s", str(REQUEST_TIMEOUT_S), "--http-port", "0")
    try:
        yield address, f"http://127.0.0.1:{(tmp / 'router2.port.http').read_text().strip()}"
    finally:
        proc.terminate()
        proc.wait(30)


def _post(url: str, body: dict) -> tuple[int, dict, Message]:  # type: ignore[type-arg]
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def test_no_room_is_429_with_retry_after(mesh: Mesh, tight: tuple[str, str]) -> None:
    address, url = tight
    holding = threading.Event()
    with Client(address, timeout=60) as c:
        call = c.stream([5, 6, 7, 8], max_tokens=1000, temperature=0, ignore_eos=True)

        def hold() -> None:  # the one request in flight, until cancelled
            try:
                for _ in call:
                    holding.set()
            except grpc.RpcError:
                pass

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert holding.wait(30)
            status, body, headers = _post(url, {"model": mesh.spec.model, "prompt": [5, 6], "max_tokens": 2})
        finally:
            call.cancel()
            t.join(30)
    assert status == 429, body
    assert headers["Retry-After"] == "1" and body["error"]["type"] == "RateLimitError", (dict(headers), body)
    assert body["error"]["message"].count("retry") == 1, body
    wait_idle(mesh)


def test_past_the_deadline_is_504_and_frees_every_block(mesh: Mesh, tight: tuple[str, str]) -> None:
    _, url = tight
    started = time.monotonic()
    status, body, _ = _post(url, {"model": mesh.spec.model, "prompt": [5, 6, 7], "max_tokens": 2000,
                                  "ignore_eos": True, "temperature": 0})
    took = time.monotonic() - started
    assert status == 504 and body["error"]["type"] == "TimeoutError", body
    assert "did not finish before its deadline" in body["error"]["message"], body
    assert took < 10 * REQUEST_TIMEOUT_S, took  # the deadline is the feature: 10x its 0.5 s
    wait_idle(mesh)
