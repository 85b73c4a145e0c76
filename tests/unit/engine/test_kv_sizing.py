"""The KV pool's size: blocks as given, a memory budget, or a fraction of the GPU."""

from __future__ import annotations

import pytest

from pdmesh.config import CacheConfig, EngineArgs, SchedulerConfig
from pdmesh.engine.kv_sizing import GIB, DeviceMemory, activation_bytes, pool_blocks
from pdmesh.errors import InvalidRequestError
from pdmesh.model.config import ModelConfig

CFG = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
                             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                             "num_key_value_heads": 8})
SCHED = SchedulerConfig()
BLOCK = 2 * 32 * 16 * 8 * 128 * 2  # K and V, 32 layers, 16 tokens, 8 heads of 128, bf16


def test_blocks_as_given_then_the_memory_budget() -> None:
    assert pool_blocks(CacheConfig(num_blocks=77), SCHED, CFG, BLOCK, 2) == 77
    assert pool_blocks(CacheConfig(kv_cache_memory_gb=1.0), SCHED, CFG, BLOCK, 2) == GIB // BLOCK


def test_a_fraction_of_the_gpu_takes_what_the_weights_and_a_step_leave() -> None:
    total, weights = 141 * GIB, 16 * GIB  # an H200 after an 8B model's bf16 weights
    memory = DeviceMemory(free=total - weights, total=total)
    blocks = pool_blocks(CacheConfig(), SCHED, CFG, BLOCK, 2, 0.9, memory)
    expected = (int(0.9 * total) - weights - activation_bytes(CFG, SCHED, 2)) // BLOCK
    assert blocks == expected
    assert 100 * GIB < blocks * BLOCK < 0.9 * total - weights


def test_a_fraction_that_leaves_nothing_says_both_figures() -> None:
    memory = DeviceMemory(free=1 * GIB, total=80 * GIB)
    with pytest.raises(InvalidRequestError, match=r"0.5 of the device's 80.0 GiB leaves 0.00 GiB for the KV pool "
                                                  r"after 79.0 GiB already in use"):
        pool_blocks(CacheConfig(), SCHED, CFG, BLOCK, 2, 0.5, memory)


def test_the_fraction_is_bounded_and_only_for_cuda() -> None:
    with pytest.raises(InvalidRequestError, match="gpu_memory_utilization: must be a fraction in"):
        EngineArgs(model="m", device="cuda", gpu_memory_utilization=1.5)
    with pytest.raises(InvalidRequestError, match="applies to CUDA devices"):
        EngineArgs(model="m", gpu_memory_utilization=0.9)
    EngineArgs(model="m", device="cuda:1", gpu_memory_utilization=0.9)
