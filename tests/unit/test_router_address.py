"""``pdmesh generate --router`` / ``pdmesh status`` targets: the port defaults to 50051."""

from pdmesh.client import DEFAULT_PORT, router_address


def test_a_bare_host_gets_the_default_port() -> None:
    assert DEFAULT_PORT == 50051
    assert router_address("localhost") == "localhost:50051"  # grpc would dial 443
    assert router_address("grpc://10.0.0.5") == "10.0.0.5:50051"
    assert router_address("10.0.0.5:7000") == "10.0.0.5:7000"
    assert router_address("[::1]") == "[::1]:50051" and router_address("[::1]:9") == "[::1]:9"
