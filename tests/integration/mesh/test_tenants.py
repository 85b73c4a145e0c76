"""Tenants separated by ``cache_salt`` share no prefix-cache entry, so ``cached_tokens``
tells one tenant nothing about what another sent."""

from __future__ import annotations

import random

from pdmesh.client import Client
from pdmesh.launcher import Mesh


def test_cached_tokens_do_not_leak_across_tenants(mesh: Mesh, client: Client) -> None:
    rng = random.Random(404)
    secret = [rng.randrange(5, 1000) for _ in range(96)]  # 6 full blocks
    first = client.complete(secret + [1, 2], max_tokens=2, temperature=0, cache_salt="tenant-a")
    assert first.cached_tokens == 0
    again = client.complete(secret + [3, 4], max_tokens=2, temperature=0, cache_salt="tenant-a")
    assert again.cached_tokens >= 80  # the owner hits its own cache (control)
    # The same text from another tenant, or from no tenant, hits nothing: a cached count
    # above zero would reveal that someone sent this prefix.
    for salt in ("tenant-b", ""):
        probe = client.complete(secret + [3, 4], max_tokens=2, temperature=0, cache_salt=salt)
        assert probe.cached_tokens == 0, salt
