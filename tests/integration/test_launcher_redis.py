"""The launcher's redis-server start when the port it chose is taken before Redis binds it
(``free_port`` binds and closes, so another process may take the port in between: one
bench run of the suite failed "redis-server did not start" so)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import pdmesh.launcher as launcher
from pdmesh.errors import StartError
from pdmesh.launcher import Mesh
from pdmesh.mesh_spec import MeshSpec


@pytest.fixture()
def taken_port() -> Iterator[int]:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        yield held.getsockname()[1]
    finally:
        held.close()


def test_a_chosen_port_taken_meanwhile_is_chosen_again(taken_port: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    choices = iter([taken_port])
    free_port = launcher.free_port
    monkeypatch.setattr(launcher, "free_port", lambda: next(choices, None) or free_port())
    mesh = Mesh(MeshSpec(model="unused", log_dir=str(tmp_path)))
    mesh.start_redis()
    try:
        assert mesh.redis_port != taken_port
        with socket.create_connection(("127.0.0.1", mesh.redis_port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            assert s.recv(16).startswith(b"+PONG")
    finally:
        mesh.stop_redis()


def test_a_port_asked_for_that_is_taken_fails_at_once_saying_why(taken_port: int, tmp_path: Path) -> None:
    mesh = Mesh(MeshSpec(model="unused", log_dir=str(tmp_path)))
    with pytest.raises(StartError, match=f"(?s)did not start on port {taken_port}.*Address already in use"):
        mesh.start_redis(taken_port)
    mesh.stop_redis()
