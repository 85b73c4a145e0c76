"""A mesh with mutual TLS on every gRPC hop and an API key on the public front: it serves
exactly, and a client without the certificate or the key is refused with a clear status."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client, Security
from pdmesh.launcher import Mesh, MeshSpec
from tests.conftest import HFReference
from tests.integration.mesh.conftest import WORKER_ARGS, start_process

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA and one certificate for 127.0.0.1 (server and client use), made by openssl."""
    d = tmp_path_factory.mktemp("certs")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=pdmesh-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "mesh.key", "-out", "mesh.csr", "-subj", "/CN=pdmesh")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                               "extendedKeyUsage=serverAuth,clientAuth\n")
    run("x509", "-req", "-in", "mesh.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "mesh.pem", "-days", "2", "-extfile", "ext.cnf")
    return d


@pytest.fixture(scope="module")
def tls_mesh(llama_dir: Path, certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=1, worker_args=WORKER_ARGS,
                    router_args=["--api-key", KEY], http_port=0, log_dir=str(tmp_path_factory.mktemp("tls-logs")),
                    tls_cert=str(certs / "mesh.pem"), tls_key=str(certs / "mesh.key"),
                    tls_ca=str(certs / "ca.pem"))
    with Mesh(spec) as m:
        yield m


def full(certs: Path, **changes: str) -> Security:
    base = {"tls_ca": str(certs / "ca.pem"), "tls_cert": str(certs / "mesh.pem"),
            "tls_key": str(certs / "mesh.key"), "api_key": KEY}
    return Security(**(base | changes))


def test_mutual_tls_mesh_serves_exactly(tls_mesh: Mesh, certs: Path, hf_refs: dict[str, HFReference]) -> None:
    prompt = [5, 9, 300, 42, 17, 8, 99, 1000 - 7] * 10  # 80 tokens: 5 blocks written over NIXL
    with Client(tls_mesh.router_address, timeout=120, security=full(certs)) as c:
        out = c.complete(prompt, max_tokens=12, temperature=0)
    assert out.token_ids == hf_refs["llama"].greedy(prompt, 12)


@pytest.mark.parametrize(
    ("security", "code", "words"),
    [
        ({"tls_ca": "", "tls_cert": "", "tls_key": ""}, grpc.StatusCode.UNAVAILABLE, ""),  # plaintext
        ({"tls_cert": "", "tls_key": ""}, grpc.StatusCode.UNAVAILABLE, ""),  # no client certificate
        ({"api_key": ""}, grpc.StatusCode.UNAUTHENTICATED, "requires an API key"),
        ({"api_key": "wrong"}, grpc.StatusCode.UNAUTHENTICATED, "wrong API key"),
    ],
)
def test_a_client_without_certificate_or_key_is_refused(
    tls_mesh: Mesh, certs: Path, security: dict[str, str], code: grpc.StatusCode, words: str
) -> None:
    with Client(tls_mesh.router_address, timeout=10, security=full(certs, **security)) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete([5, 6, 7], max_tokens=2)
    assert err.value.code() == code
    assert words in (err.value.details() or "")


def test_status_needs_the_same_credentials(tls_mesh: Mesh, certs: Path) -> None:
    import sys

    base = [sys.executable, "-m", "pdmesh", "status", tls_mesh.router_address, "--tls-ca", str(certs / "ca.pem"),
            "--tls-cert", str(certs / "mesh.pem"), "--tls-key", str(certs / "mesh.key")]
    ok = subprocess.run([*base, "--api-key", KEY], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "serving" in ok.stdout, ok.stderr
    refused = subprocess.run([*base, "--api-key", ""], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr


def test_the_http_front_is_https_with_the_same_key(tls_mesh: Mesh, certs: Path) -> None:
    import json
    import ssl
    import urllib.error
    import urllib.request

    assert tls_mesh.http_url.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    body = json.dumps({"model": tls_mesh.spec.model, "prompt": [5, 6, 7, 8], "max_tokens": 3,
                       "temperature": 0}).encode()

    def post(key: str) -> dict:  # type: ignore[type-arg]
        req = urllib.request.Request(tls_mesh.http_url + "/v1/completions", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
            return json.loads(resp.read())

    assert post(KEY)["usage"]["completion_tokens"] == 3
    with pytest.raises(urllib.error.HTTPError) as err:
        post("wrong")
    assert err.value.code == 401


def test_a_public_port_without_client_certificates_still_needs_the_key(
    tls_mesh: Mesh, certs: Path, tmp_path: Path
) -> None:
    """``--require-client-cert false``: public clients verify the router and send the API
    key; the router's own hops to the workers stay mutual TLS."""
    import time

    from pdmesh.rpc.tls import TLSFiles

    tls_flags = ["--tls-cert", str(certs / "mesh.pem"), "--tls-key", str(certs / "mesh.key"),
                 "--tls-ca", str(certs / "ca.pem")]
    files = TLSFiles.load(str(certs / "mesh.pem"), str(certs / "mesh.key"), str(certs / "ca.pem"))
    proc, address = start_process(tmp_path, "router2", [
        "router", "--model", tls_mesh.spec.model, "--redis-url", tls_mesh.redis_url, "--api-key", KEY,
        "--require-client-cert", "false", *tls_flags], tls=files)
    try:
        public = Security(tls_ca=str(certs / "ca.pem"), api_key=KEY)
        with Client(address, timeout=60, security=public) as c:
            deadline = time.monotonic() + 30
            while True:  # the membership brings the workers within a poll
                try:
                    assert len(c.complete([5, 6, 7, 8], max_tokens=3, temperature=0).token_ids) == 3
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline
                    time.sleep(0.2)
        with Client(address, timeout=10, security=Security(tls_ca=str(certs / "ca.pem"))) as c:
            with pytest.raises(grpc.RpcError) as err:
                c.complete([5, 6], max_tokens=2)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        proc.terminate()
        proc.wait(30)
