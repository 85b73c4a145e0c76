"""The CPU backend's KV write kernel stores exactly what torch's indexed assignment stores,
from the layouts the model hands it (row-major slices of the qkv product, transposed
few-row products), into a layer of a multi-layer pool, and refuses slots outside it."""

from __future__ import annotations

import pytest
import torch

from pdmesh.attention.cpu_kernels import load

KERNELS = load()
LAYERS, BLOCKS, BLOCK_SIZE, KV_HEADS, DIM = 3, 16, 16, 4, 64


def _slots(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(BLOCKS * BLOCK_SIZE, generator=g)[:tokens]
    return flat // BLOCK_SIZE, flat % BLOCK_SIZE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("tokens", [1, 3, 200])
def test_the_kernel_stores_what_indexed_assignment_stores(tokens: int, transposed: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(tokens)
    # k and v as the model has them: views into one qkv product [T, q + 2 kv], row-major
    # (long prefill chunks, oneDNN) or a transposed view (``linear``'s MKL path).
    width = 512 + 2 * KV_HEADS * DIM
    qkv = torch.randn(width, tokens).to(dtype).t() if transposed else torch.randn(tokens, width).to(dtype)
    k = qkv[:, 512 : 512 + KV_HEADS * DIM].unflatten(1, (KV_HEADS, DIM))
    v = qkv[:, 512 + KV_HEADS * DIM :].unflatten(1, (KV_HEADS, DIM))
    blocks, offsets = _slots(tokens, tokens)
    pool = torch.randn(BLOCKS, LAYERS, 2, BLOCK_SIZE, KV_HEADS, DIM).to(dtype)
    want = pool.clone()
    want[:, 1, 0][blocks, offsets] = k
    want[:, 1, 1][blocks, offsets] = v
    layer = pool[:, 1]
    KERNELS.write_kv_(layer, k, v, blocks, offsets)
    assert torch.equal(pool, want)  # the written slots, and nothing else in any layer


def test_a_slot_outside_the_pool_is_refused_before_anything_is_written() -> None:
    pool = torch.zeros(BLOCKS, 2, BLOCK_SIZE, KV_HEADS, DIM)
    k = v = torch.ones(2, KV_HEADS, DIM)
    for blocks, offsets in (([0, BLOCKS], [0, 0]), ([0, 1], [0, BLOCK_SIZE]), ([-1, 0], [0, 0])):
        with pytest.raises(RuntimeError, match="outside the pool"):
            KERNELS.write_kv_(pool, k, v, torch.tensor(blocks), torch.tensor(offsets))
    assert not pool.any()
