"""Engine configuration, parsed once at start-up and passed down (never read from env here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pdmesh.kv.block_hash import HashAlgorithm

DType = Literal["float32", "bfloat16", "float16", "auto"]


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
    attention_backend: Literal["auto", "torch", "flashinfer"] = "auto"
    """"auto" picks flashinfer on CUDA when installed, else the torch backend."""
    num_threads: int | None = None
    """torch intra-op threads on CPU (None keeps torch's default)."""
