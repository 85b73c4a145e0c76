"""kvstore configuration (YAML, ``PDMESH_KVSTORE_*`` env, flags)."""

from __future__ import annotations

from dataclasses import dataclass

from pdmesh.config import MeshContract
from pdmesh.service_config import ServerConfig


@dataclass(frozen=True, kw_only=True)
class KVStoreConfig(MeshContract, ServerConfig):
    """The model fixes the block layout (layers, KV heads, head dim) with dtype and block size."""

    worker_id: str = "kvstore-0"
    """Unique name, also the NIXL agent name."""
    memory_gb: float = 1.0
    """Byte budget of the block pool."""
    redis_url: str = ""
    """Publish which blocks the store holds (tier "kvstore") into the prefix index."""
