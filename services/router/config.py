"""Router configuration (YAML, ``PDMESH_ROUTER_*`` env, flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RouterConfig:
    model: str
    """Model folder: the router tokenizes with its tokenizer and checks workers serve it."""
    host: str = "127.0.0.1"
    port: int = 0
    port_file: str = ""
    metrics_port: int = -1
    """Prometheus /metrics port: -1 off, 0 any free port (written to ``{port_file}.metrics``)."""
    prefill: tuple[str, ...] = ()
    """Prefill worker addresses (host:port)."""
    decode: tuple[str, ...] = ()
    """Decode worker addresses (host:port)."""
    redis_url: str = ""
    """The prefix index; empty = route by consistent hashing only."""
    prefill_policy: Literal["cache_aware", "prefix_hash", "least_loaded", "round_robin"] = "cache_aware"
    decode_policy: Literal["least_loaded", "round_robin"] = "least_loaded"
    disaggregation: Literal["strict", "fallback_local"] = "fallback_local"
    """strict: fail (UNAVAILABLE) without a healthy prefill worker; fallback_local: the
    decode worker prefills itself, counted in RouterStats."""
    local_prefill_tokens: int = 0
    """Prompts with fewer uncached tokens than this prefill on the decode worker (0 = never)."""
    block_size: int = 16
    hash_seed: int = 0
    hash_algorithm: Literal["xxh3_128", "sha256"] = "xxh3_128"
    """The mesh's hashing contract; workers that differ are refused."""
    cache_weight: float = 1.0
    """cache_aware: value of one cached prompt token ..."""
    load_weight: float = 64.0
    """... against one request in flight on a worker."""
    kvstore_weight: float = 0.8
    """cache_aware: a block in the kvstore tier is worth this fraction of one cached locally
    (any prefill worker can fetch it, at the cost of a transfer)."""
    balance_threshold: int = 8
    """cache_aware imbalance guard: when in-flight counts differ by more, pick the least loaded."""
    info_interval_s: float = 0.5
    request_timeout_s: float = 600.0
    """Deadline for requests that carry none."""
    lease_ms: int = 30000
    drain_grace_s: float = 10.0
