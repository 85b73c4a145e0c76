"""Configuration of a prefill or decode worker (YAML, ``PDMESH_WORKER_*`` env, flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class WorkerConfig:
    model: str
    """Hugging Face model folder."""
    role: Literal["prefill", "decode"] = "decode"
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port (written to ``port_file``)."""
    port_file: str = ""
    advertise_address: str = ""
    """host:port peers use to reach this process (empty: host:port, or this machine's
    hostname when host is a wildcard such as 0.0.0.0)."""
    metrics_port: int = -1
    """Prometheus /metrics port: -1 off, 0 any free port (written to ``{port_file}.metrics``)."""
    """Where to write the bound port, for launchers that start on port 0."""
    worker_id: str = ""
    """Unique name, also the NIXL agent name; empty = "{role}-{port}"."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int = 0
    """KV pool size in blocks; 0 sizes it from ``kv_cache_memory_gb``."""
    kv_cache_memory_gb: float = 1.0
    hash_seed: int = 0
    hash_algorithm: Literal["xxh3_128", "sha256"] = "xxh3_128"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 0
    """0 = the model's own."""
    threads: int = 0
    """torch intra-op threads (0 = torch's default)."""
    redis_url: str = ""
    """Publish prefix-cache events here (prefill workers); empty = no index."""
    kvstore: str = ""
    """Address of the kvstore tier (prefill workers offload to and fetch from it)."""
    lease_ms: int = 30000
    """Default lifetime of a decode reservation whose KV has not arrived."""
    transfer_timeout_s: float = 30.0
    """Longest a KV write may take before the prefill fails with ABORTED."""
    drain_grace_s: float = 10.0
    """On SIGTERM, how long in-flight calls may finish."""

    def resolved_id(self, port: int) -> str:
        return self.worker_id or f"{self.role}-{port}"
