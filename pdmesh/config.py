"""Engine configuration, parsed once at start-up and passed down (never read from env here).

``EngineConfig`` (nested: cache, scheduler) is what ``LLMEngine`` consumes. ``EngineArgs`` is
the one flat set of user-facing engine options with the one set of defaults: the CLI, the
worker config, ``LLM(**kwargs)`` and the benches all build their ``EngineConfig`` through it.
``MeshContract`` is the part every process of one mesh must agree on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from pdmesh.errors import InvalidRequestError
from pdmesh.kv.block_hash import HashAlgorithm
from pdmesh.kv.eviction import EvictionPolicy

DType = Literal["auto", "float32", "bfloat16", "float16"]
AttentionBackendName = Literal["auto", "torch", "cpu", "flashinfer"]


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache and its prefix cache."""

    block_size: int = 16
    """Tokens per KV block; also the unit of prefix caching and of KV transfer."""
    num_blocks: int | None = None
    """Blocks in the pool; None sizes it from ``kv_cache_memory_gb``."""
    kv_cache_memory_gb: float = 2.0
    """Memory for the KV pool when ``num_blocks`` is None."""
    gpu_memory_utilization: float = 0.0
    """CUDA: the fraction of the device's memory the worker may fill, weights, activations
    and KV pool together; the pool takes what is left (``engine/kv_sizing.py``). 0: sized
    by ``kv_cache_memory_gb``."""
    enable_prefix_caching: bool = True
    prefix_eviction: EvictionPolicy = "reuse"
    """Which free block goes first (``pdmesh/kv/eviction.py``): "reuse" keeps blocks
    another request hit (or that were computed again after eviction) past every other;
    "lru": least recently used first, whatever it held."""
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


SpecMethod = Literal["ngram", "draft_model"]
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding, under vLLM's names so a user's config carries over:
    ``{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}`` or
    ``{"method": "draft_model", "model": DIR, "num_speculative_tokens": 3}``."""

    method: SpecMethod
    """"ngram" (prompt lookup, no extra model) or "draft_model" (a small model, same tokenizer)."""
    num_speculative_tokens: int = 3
    """Draft tokens proposed per step (k); the target verifies k + 1 positions at once."""
    prompt_lookup_max: int = 4
    """ngram: the longest suffix of the context looked up earlier in it."""
    prompt_lookup_min: int = 1
    """ngram: the shortest suffix worth a lookup."""
    model: str | None = None
    """draft_model: the draft's Hugging Face folder (its vocabulary must be the target's)."""
    disable_by_batch_size: int = 4
    """Speculate only while fewer sequences than this are running: every draft is a row of
    the verification pass, and from 4 sequences on those rows cost more than they save on
    text n-gram lookup predicts only in part (docs/performance/log.md, "Speculative decoding")."""

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"speculative_config.{key}", why)

        if self.method not in ("ngram", "draft_model"):
            raise bad("method", f'must be "ngram" or "draft_model", got {self.method!r}')
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise bad("num_speculative_tokens",
                      f"must be 1..{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise bad("prompt_lookup_min", "must be >= 1 and <= prompt_lookup_max "
                      f"(got {self.prompt_lookup_min} and {self.prompt_lookup_max})")
        if self.disable_by_batch_size < 1:
            raise bad("disable_by_batch_size", f"must be >= 1, got {self.disable_by_batch_size}")
        if (self.method == "draft_model") != bool(self.model):
            raise bad("model", 'a draft model folder is required for "draft_model" and only there')

    @classmethod
    def parse(cls, value: SpeculativeConfig | Mapping[str, Any] | str | None) -> SpeculativeConfig | None:
        """From a mapping or its JSON text (the ``--speculative-config`` flag); "" / None: off."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError("speculative_config", f"is not valid JSON: {exc}") from exc
        if not isinstance(value, Mapping):
            raise InvalidRequestError("speculative_config", "must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise InvalidRequestError(f"speculative_config.{unknown[0]}",
                                      f"unknown key; known keys are {sorted(known)}")
        if "method" not in value:
            raise InvalidRequestError("speculative_config.method", "is required")
        try:
            return cls(**value)
        except TypeError as exc:
            raise InvalidRequestError("speculative_config", str(exc)) from exc


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
    """"auto": the fused C++ kernels on CPU ("cpu"); on CUDA "flashinfer" for bfloat16 and
    float16 where it imports, else "torch"."""
    num_threads: int | None = None
    """torch intra-op threads on CPU (None keeps torch's default)."""
    probe_threads: int | None = None
    """Threads the start-up measurements run on (the linear plan, ``model/linear_plan.py``);
    None: ``num_threads``. A worker that borrows idle peers' cores computes a lone prompt
    on all of them, and a plan probed on its own share chose differently: on a 2-core Zen 3
    oneDNN's prefill product was 1.03-1.09x at one thread and up to 1.31x at two, so a
    prefill worker probing on its one core never took it, and computed a lone 256-token
    prompt ~6% slower than one worker of the machine (docs/performance/log.md §27)."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding; None decodes one token per step."""
    cuda_graphs: bool = True
    """On CUDA with the flashinfer backend, decode steps replay CUDA graphs captured at
    start-up for batch sizes up to max_num_seqs (``engine/cuda_graphs.py``); False runs
    every step eagerly."""


@dataclass(frozen=True, kw_only=True)
class MeshContract:
    """What every process of one mesh must share; the router refuses workers that differ."""

    model: str
    """Hugging Face model folder, or a hub id ORG/NAME[@REVISION] fetched through the local
    Hugging Face cache (HF_HUB_OFFLINE, HF_TOKEN, HF_HOME apply)."""
    dtype: DType = EngineConfig.dtype
    """Weights and KV dtype; "auto" uses the model config's torch_dtype (float32 if unset)."""
    block_size: int = CacheConfig.block_size
    """Tokens per KV block: the unit of prefix caching, routing and KV transfer."""
    hash_seed: int = CacheConfig.hash_seed
    """Seed of the chained block hashes."""
    hash_algorithm: HashAlgorithm = CacheConfig.hash_algorithm
    """Block hash function."""

    def __post_init__(self) -> None:
        _at_least("block_size", self.block_size, 1)


@dataclass(frozen=True, kw_only=True)
class EngineArgs(MeshContract):
    """The engine's options, flat: one field per flag / YAML key / environment variable."""

    device: str = EngineConfig.device
    """torch device of weights and KV ("cpu", "cuda", "cuda:1" ...)."""
    num_blocks: int = 0
    """KV pool size in blocks; 0 sizes it from kv_cache_memory_gb."""
    kv_cache_memory_gb: float = CacheConfig.kv_cache_memory_gb
    """Memory for the KV pool when num_blocks is 0."""
    gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization
    """CUDA: fraction of the device's memory the worker may fill (weights, activations and
    the KV pool, which takes what is left after the weights), as vLLM's flag; 0 = size the
    pool by kv_cache_memory_gb. Ignored when num_blocks is set."""
    enable_prefix_caching: bool = CacheConfig.enable_prefix_caching
    """Keep computed prompt blocks for reuse by later requests."""
    prefix_eviction: EvictionPolicy = CacheConfig.prefix_eviction
    """Which cached block goes first under memory pressure: "reuse" keeps blocks other
    requests hit past one-off ones; "lru": least recently used first."""
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
    cuda_graphs: bool = EngineConfig.cuda_graphs
    """On CUDA with flashinfer: replay decode steps from graphs captured at start-up (false: eager)."""
    speculative_config: dict[str, Any] | str | None = None
    """Speculative decoding as JSON, vLLM's keys: {"method": "ngram", "num_speculative_tokens": 3}
    or {"method": "draft_model", "model": DIR} (unset: off)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low in (("num_blocks", 0), ("max_num_batched_tokens", 1), ("max_num_seqs", 1),
                          ("long_prefill_token_threshold", 0), ("max_model_len", 0), ("threads", 0)):
            _at_least(name, getattr(self, name), low)
        if not self.kv_cache_memory_gb > 0:
            raise InvalidRequestError("kv_cache_memory_gb", f"must be > 0, got {self.kv_cache_memory_gb}")
        if not 0 <= self.gpu_memory_utilization <= 1:
            raise InvalidRequestError("gpu_memory_utilization",
                                      f"must be a fraction in [0, 1], got {self.gpu_memory_utilization}")
        if self.gpu_memory_utilization and not self.device.startswith("cuda"):
            raise InvalidRequestError("gpu_memory_utilization", "applies to CUDA devices (--device cuda); on "
                                      "the CPU size the pool with --kv-cache-memory-gb or --num-blocks")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model, dtype=self.dtype, device=self.device,
            max_model_len=self.max_model_len or None, num_threads=self.threads or None,
            attention_backend=self.attention_backend, cuda_graphs=self.cuda_graphs,
            speculative=SpeculativeConfig.parse(self.speculative_config),
            cache=CacheConfig(
                block_size=self.block_size, num_blocks=self.num_blocks or None,
                kv_cache_memory_gb=self.kv_cache_memory_gb,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_prefix_caching=self.enable_prefix_caching,
                prefix_eviction=self.prefix_eviction,
                hash_algorithm=self.hash_algorithm, hash_seed=self.hash_seed,
            ),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_num_seqs=self.max_num_seqs,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
            ),
        )


def _at_least(name: str, value: int, low: int) -> None:
    """A start-up option's lower bound, refused naming the option (a zero block size
    divided by zero deep in a worker before)."""
    if value < low:
        raise InvalidRequestError(name, f"must be >= {low}, got {value}")
