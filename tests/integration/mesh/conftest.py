"""A real mesh for the package: redis-server, 2 prefill + 1 decode workers, the router."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pdmesh.client import Client
from pdmesh.launcher import Mesh
from tests.integration.mesh_tools import shared_spec


@pytest.fixture(scope="package")
def mesh(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with Mesh(shared_spec(llama_dir, tmp_path_factory.mktemp("mesh-logs"))) as m:
        yield m


@pytest.fixture()
def client(mesh: Mesh) -> Iterator[Client]:
    with Client(mesh.router_address, timeout=120) as c:
        yield c
