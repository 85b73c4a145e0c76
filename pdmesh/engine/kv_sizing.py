"""How many KV blocks an engine's pool gets, and whether weights and pool fit at all.

In order: ``num_blocks`` as given; on CUDA with ``gpu_memory_utilization``, what that
fraction of the device leaves after everything already on it (this worker's weights, any
other process) and a step's activations, as vLLM's flag of the same name does; else
``kv_cache_memory_gb``. A budget that cannot hold one block is refused with the figures,
rather than an out-of-memory error in the first large batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pdmesh.config import CacheConfig, EngineConfig, SchedulerConfig
from pdmesh.errors import InvalidRequestError
from pdmesh.kv.layout import DTYPE_BYTES, KVLayout, resolve_dtype_name
from pdmesh.model.config import ModelConfig
from pdmesh.model.loader import safetensors_files
from pdmesh.model.memory import (
    GIB,
    check_fits,
    checkpoint_elements,
    host_available_bytes,
)

WORKSPACE_BYTES = 512 * 2**20
"""Held back beyond the step's tensors: attention workspaces, the CUDA graphs' pools,
cuBLAS's workspace, the allocator's fragmentation."""


@dataclass(frozen=True)
class DeviceMemory:
    free: int
    """Bytes free on the device now (``torch.cuda.mem_get_info``), weights already loaded."""
    total: int


def activation_bytes(cfg: ModelConfig, sched: SchedulerConfig, elem_bytes: int) -> int:
    """An upper estimate of one step's transient tensors: every batched token's widest
    activations (the gate/up output and its product, q/k/v or MLA's query, latent and
    expanded keys and values, residual and norms) and
    float32 logits for every sequence's sampled row, twice (the sampler's copies)."""
    attention = ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim if cfg.mla is None else
                 cfg.num_heads * (2 * cfg.mla.qk_head_dim + cfg.mla.v_head_dim) + cfg.mla.latent_dim)
    per_token = 3 * cfg.intermediate_size + attention + 4 * cfg.hidden_size
    logits = 2 * sched.max_num_seqs * cfg.vocab_size * 4
    return sched.max_num_batched_tokens * per_token * elem_bytes + logits + WORKSPACE_BYTES


def pool_blocks(cache: CacheConfig, sched: SchedulerConfig, cfg: ModelConfig, block_bytes: int,
                elem_bytes: int, gpu_memory_utilization: float = 0.0,
                memory: DeviceMemory | None = None) -> int:
    """The pool's block count; ``memory`` is the device's, read after the weights loaded
    (needed only with ``gpu_memory_utilization``)."""
    if cache.num_blocks:
        return cache.num_blocks
    if not gpu_memory_utilization:
        return max(1, int(cache.kv_cache_memory_gb * GIB) // block_bytes)
    if memory is None:
        raise InvalidRequestError("gpu_memory_utilization",
                                  "applies to CUDA devices; on the CPU size the pool with --kv-cache-memory-gb "
                                  "or --num-blocks")
    in_use = memory.total - memory.free
    reserve = activation_bytes(cfg, sched, elem_bytes)
    budget = int(gpu_memory_utilization * memory.total) - in_use - reserve
    if budget < block_bytes:
        raise InvalidRequestError(
            "gpu_memory_utilization",
            f"{gpu_memory_utilization:g} of the device's {memory.total / GIB:.1f} GiB leaves "
            f"{max(0, budget) / GIB:.2f} GiB for the KV pool after {in_use / GIB:.1f} GiB already in use "
            f"(the weights, other processes) and {reserve / GIB:.2f} GiB for a step's activations; "
            "raise it, lower --max-num-batched-tokens / --max-num-seqs, or give --num-blocks")
    return budget // block_bytes


def device_memory(device: str) -> DeviceMemory | None:
    """The CUDA device's free and total bytes now (after the weights loaded); None on CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return DeviceMemory(int(free), int(total))


def check_memory_before_loading(config: EngineConfig, cfg: ModelConfig) -> None:
    """Before loading: do the weights (at the dtype they will run in) and the KV pool asked
    for fit the memory the device has free? (``model/memory.py``)."""
    cc = config.cache
    dtype = resolve_dtype_name(config.dtype, cfg, config.device)
    weights = checkpoint_elements(safetensors_files(Path(config.model))) * DTYPE_BYTES[dtype]
    block = KVLayout.for_model(cfg, cc.block_size, dtype).block_bytes
    fraction = cc.gpu_memory_utilization and not cc.num_blocks  # that pool is sized after the weights
    kv = 0 if fraction else pool_blocks(cc, config.scheduler, cfg, block, DTYPE_BYTES[dtype]) * block
    memory = device_memory(config.device)
    available, where = (memory.free, config.device) if memory is not None else (host_available_bytes(), "this host")
    check_fits(weights, kv, available, where)
