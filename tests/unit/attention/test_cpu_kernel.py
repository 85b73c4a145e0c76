"""The fused CPU decode kernel against the torch reference backend, on scattered block tables."""

from __future__ import annotations

import pytest
import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.cpu_backend import CPUAttentionBackend
from pdmesh.attention.cpu_kernels import cpu_flags, module_name
from pdmesh.attention.torch_backend import TorchAttentionBackend

BS, HKV, D = 16, 4, 64


def _meta(lens: list[int], num_blocks: int, seed: int) -> AttentionMetadata:
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // BS) for n in lens)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    rows, used = [], 0
    for n in lens:
        k = -(-n // BS)
        rows.append(perm[used : used + k] + [0] * (width - k))
        used += k
    lens_t = torch.tensor(lens)
    keys = torch.arange(width * BS)
    bias = torch.zeros((len(lens), 1, 1, width * BS)).masked_fill_(
        (keys[None, :] >= lens_t[:, None])[:, None, None, :], float("-inf"))
    zeros = torch.zeros(len(lens), dtype=torch.long)
    return AttentionMetadata(len(lens), zeros, zeros, torch.tensor(rows), bias, lens_t)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads", [4, 8])  # MHA and GQA groups of 2
def test_kernel_matches_the_torch_backend(dtype: torch.dtype, tol: float, heads: int) -> None:
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(300, 3, 2, BS, HKV, D, generator=g).to(dtype)
    layer = pool[:, 1]  # a strided layer view, as the model passes it
    lens = [1, 15, 16, 17, 100, 288, 33, 2]
    meta = _meta(lens, 300, seed=1)
    q = torch.randn(len(lens), heads, D, generator=g).to(dtype)
    ref = TorchAttentionBackend()._decode(q, layer, meta, D**-0.5)
    out = CPUAttentionBackend()._decode(q, layer, meta, D**-0.5)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_the_kernel_cache_is_keyed_by_the_cpus_flags() -> None:
    # Built with -march=native: a build from another CPU must never be loaded here.
    here = cpu_flags()
    assert module_name(here) == module_name(here)
    assert module_name("avx2 fma sse4_2") != module_name("avx2 avx512f fma sse4_2")


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_young_one_waited_for(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import time

    from pdmesh.attention.cpu_kernels import wait_for_build_lock

    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 700
    os.utime(lock, (old, old))
    wait_for_build_lock(tmp_path, stale_s=600)  # stale: removed, no wait
    assert not lock.exists()
    lock.touch()  # a build holding it now: waited for until it would be stale
    start = time.monotonic()
    wait_for_build_lock(tmp_path, stale_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - start < 2 and not lock.exists()
    wait_for_build_lock(tmp_path / "nothing-here")  # no lock: returns at once
