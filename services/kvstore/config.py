"""kvstore configuration (YAML, ``PDMESH_KVSTORE_*`` env, flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class KVStoreConfig:
    model: str
    """Model folder: fixes the block layout (layers, KV heads, head dim)."""
    host: str = "127.0.0.1"
    port: int = 0
    port_file: str = ""
    advertise_address: str = ""
    """host:port peers use to reach this process (empty: host:port, or this machine's
    hostname when host is a wildcard such as 0.0.0.0)."""
    metrics_port: int = -1
    """Prometheus /metrics port: -1 off, 0 any free port (written to ``{port_file}.metrics``)."""
    worker_id: str = "kvstore-0"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    block_size: int = 16
    hash_seed: int = 0
    hash_algorithm: Literal["xxh3_128", "sha256"] = "xxh3_128"
    memory_gb: float = 1.0
    """Byte budget of the block pool."""
    redis_url: str = ""
    """Publish which blocks the store holds (tier "kvstore") into the prefix index."""
    drain_grace_s: float = 5.0
