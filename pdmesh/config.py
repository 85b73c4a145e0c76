"""Engine configuration, parsed once at start-up and passed down (never read from env here).

``EngineConfig`` (nested: cache, scheduler) is what ``LLMEngine`` consumes. ``EngineArgs`` is
the one flat set of user-facing engine options with the one set of defaults: the CLI, the
worker config, ``LLM(**kwargs)`` and the benches all build their ``EngineConfig`` through it.
``MeshContract`` is the part every process of one mesh must agree on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pdmesh.kv.block_hash import HashAlgorithm

DType = Literal["auto", "float32", "bfloat16", "float16"]
AttentionBackendName = Literal["auto", "torch", "cpu"]


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache and its prefix cache."""

    block_size: int = 16
    """Tokens per KV block; also the unit of prefix caching and of KV transfer."""
    num_blocks: int | None = None
    """Blocks in the pool; None sizes it from ``kv_cache_memory_gb``."""
    kv_cache_memory_gb: float = 2.0
    """Memory for the KV pool when ``num_blocks`` is None."""
    enable_prefix_caching: bool = True
    hash_algorithm: HashAlgorithm = "xxh3_128"
    hash_seed: int = 0
    """Every worker of one mesh must use the same seed (and algorithm, block size)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits."""

    max_num_batched_tokens: int = 2048
    """Token budget of one step (prefill chunks plus decode tokens)."""
    max_num_seqs: int = 128
    """Most sequences running at once."""
    long_prefill_token_threshold: int = 0
    """Cap on one sequence's prefill chunk per step (0 = the whole budget)."""


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``LLMEngine`` needs."""

    model: str
    """Path of a Hugging Face model folder."""
    dtype: DType = "auto"
    """Weights and activations; "auto" uses the config's torch_dtype (float32 if unset)."""
    device: str = "cpu"
    max_model_len: int | None = None
    """Longest prompt + output; None uses the model's max_position_embeddings."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    attention_backend: AttentionBackendName = "auto"
    """"auto": the fused C++ kernels on CPU ("cpu"), else "torch"."""
    num_threads: int | None = None
    """torch intra-op threads on CPU (None keeps torch's default)."""


@dataclass(frozen=True, kw_only=True)
class MeshContract:
    """What every process of one mesh must share; the router refuses workers that differ."""

    model: str
    """Hugging Face model folder."""
    dtype: DType = EngineConfig.dtype
    """Weights and KV dtype; "auto" uses the model config's torch_dtype (float32 if unset)."""
    block_size: int = CacheConfig.block_size
    """Tokens per KV block: the unit of prefix caching, routing and KV transfer."""
    hash_seed: int = CacheConfig.hash_seed
    """Seed of the chained block hashes."""
    hash_algorithm: HashAlgorithm = CacheConfig.hash_algorithm
    """Block hash function."""


@dataclass(frozen=True, kw_only=True)
class EngineArgs(MeshContract):
    """The engine's options, flat: one field per flag / YAML key / environment variable."""

    device: str = EngineConfig.device
    """torch device of weights and KV ("cpu", "cuda", "cuda:1" ...)."""
    num_blocks: int = 0
    """KV pool size in blocks; 0 sizes it from kv_cache_memory_gb."""
    kv_cache_memory_gb: float = CacheConfig.kv_cache_memory_gb
    """Memory for the KV pool when num_blocks is 0."""
    enable_prefix_caching: bool = CacheConfig.enable_prefix_caching
    """Keep computed prompt blocks for reuse by later requests."""
    max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens
    """Token budget of one step (prefill chunks plus decode tokens)."""
    max_num_seqs: int = SchedulerConfig.max_num_seqs
    """Most sequences running at once."""
    long_prefill_token_threshold: int = SchedulerConfig.long_prefill_token_threshold
    """Cap on one sequence's prefill chunk per step (0 = the whole budget)."""
    max_model_len: int = 0
    """Longest prompt + output (0 = the model's max_position_embeddings)."""
    threads: int = 0
    """torch intra-op threads (0 = torch's default)."""
    attention_backend: AttentionBackendName = EngineConfig.attention_backend
    """Attention implementation; "auto" picks the best available for the device."""

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model, dtype=self.dtype, device=self.device,
            max_model_len=self.max_model_len or None, num_threads=self.threads or None,
            attention_backend=self.attention_backend,
            cache=CacheConfig(
                block_size=self.block_size, num_blocks=self.num_blocks or None,
                kv_cache_memory_gb=self.kv_cache_memory_gb,
                enable_prefix_caching=self.enable_prefix_caching,
                hash_algorithm=self.hash_algorithm, hash_seed=self.hash_seed,
            ),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_num_seqs=self.max_num_seqs,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
            ),
        )
