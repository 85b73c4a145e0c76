"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pdmesh.launcher import Mesh, MeshSpec


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A private redis-server for one test (the prefix index's tests)."""
    mesh = Mesh(MeshSpec(model="redis-only", log_dir=str(tmp_path)))
    mesh.start_redis()
    yield mesh.redis_url
    mesh.stop_redis()
