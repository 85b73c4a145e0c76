"""A mesh with mutual TLS on every gRPC hop and an API key on the public front: it serves
exactly, and a client without the certificate or the key is refused with a clear status."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdmesh.client import Client, Security
from pdmesh.launcher import Mesh, MeshSpec
from tests.integration.mesh_tools import WORKER_ARGS, start_process
from tests.oracle import HFReference

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA with one certificate for 127.0.0.1 (server and client use), and a second CA
    with a certificate of its own (a stranger's), made by openssl."""
    d = tmp_path_factory.mktemp("certs")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
            "-days", "2", "-subj", f"/CN=pdmesh-test-{ca}")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                               "extendedKeyUsage=serverAuth,clientAuth\n")
    for leaf, ca in (("mesh", "ca"), ("stranger", "other-ca")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr",
            "-subj", f"/CN={leaf}")
        run("x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{leaf}.pem", "-days", "2", "-extfile", "ext.cnf")
    return d


@pytest.fixture(scope="module")
def tls_mesh(llama_dir: Path, certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = MeshSpec(model=str(llama_dir), prefill=1, decode=1, kvstore=1, worker_args=WORKER_ARGS,
                    router_args=["--api-key", KEY], http_port=0, log_dir=str(tmp_path_factory.mktemp("tls-logs")),
                    tls_cert=str(certs / "mesh.pem"), tls_key=str(certs / "mesh.key"),
                    tls_ca=str(certs / "ca.pem"))
    # A handshake the router refuses reaches the client only as a closed socket; gRPC core
    # logs its cause at INFO, which the refusal tests read from the router's log.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GRPC_VERBOSITY", "INFO")
        mesh = Mesh(spec).start()
    try:
        yield mesh
    finally:
        mesh.stop()


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
    ("security", "client_sees", "router_logs"),
    [
        # The router hangs up in the handshake: the client's call ends on a closed socket
        # (a dead router's would be "Connection refused"), the cause is in the router's log.
        ({"tls_ca": "", "tls_cert": "", "tls_key": ""}, "Socket closed", "WRONG_VERSION_NUMBER"),  # plaintext
        ({"tls_cert": "", "tls_key": ""}, "Socket closed", "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
        ({"tls_cert": "stranger.pem", "tls_key": "stranger.key"}, "Socket closed", "CERTIFICATE_VERIFY_FAILED"),
        # The client refuses the router: the cause is in the client's own status.
        ({"tls_ca": "other-ca.pem"}, "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate", ""),
        ({"tls_ca": ""}, "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate", ""),  # system roots
    ],
    ids=["plaintext", "no-client-cert", "client-cert-of-another-ca", "router-checked-against-another-ca",
         "no-tls-ca"],
)
def test_a_handshake_that_cannot_be_trusted_is_refused_for_its_cause(
    tls_mesh: Mesh, certs: Path, security: dict[str, str], client_sees: str, router_logs: str
) -> None:
    assert tls_mesh.router is not None
    logged = len(tls_mesh.router.log.read_bytes())
    files = {k: str(certs / v) if v else "" for k, v in security.items()}
    with Client(tls_mesh.router_address, timeout=10, security=full(certs, **files)) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete([5, 6, 7], max_tokens=2)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert client_sees in (err.value.details() or ""), err.value.details()
    if router_logs:
        deadline = time.monotonic() + 10
        while router_logs not in tls_mesh.router.log.read_bytes()[logged:].decode(errors="replace"):
            assert time.monotonic() < deadline, f"the router's log does not name {router_logs}"
            time.sleep(0.05)


def test_a_router_whose_certificate_names_another_host_is_refused(tls_mesh: Mesh, certs: Path) -> None:
    """The certificate is checked against the name dialled: the mesh's names 127.0.0.1 and
    localhost, so a client that expects another host refuses it."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    creds = full(certs).credentials()
    assert creds is not None
    with grpc.secure_channel(tls_mesh.router_address, creds,
                             options=[("grpc.ssl_target_name_override", "elsewhere.example")]) as ch:
        with pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Hostname Verification Check failed" in (err.value.details() or ""), err.value.details()


@pytest.mark.parametrize(("api_key", "words"), [("", "requires an API key"), ("wrong", "wrong API key")])
def test_a_client_without_the_key_is_refused(tls_mesh: Mesh, certs: Path, api_key: str, words: str) -> None:
    with Client(tls_mesh.router_address, timeout=10, security=full(certs, api_key=api_key)) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete([5, 6, 7], max_tokens=2)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
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
