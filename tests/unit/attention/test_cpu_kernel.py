"""The fused CPU decode kernel against the torch reference backend, on scattered block tables."""

from __future__ import annotations

import shutil

import pytest
import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.cpu_backend import CPUAttentionBackend
from pdmesh.attention.cpu_kernels import SOURCES, cpu_flags, module_name, tree_module_name
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
    zeros = torch.zeros(len(lens), dtype=torch.long)
    return AttentionMetadata(len(lens), zeros, zeros, torch.tensor(rows), decode_seq_lens=torch.tensor(lens))


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


@pytest.mark.parametrize(("window", "softcap"), [(24, None), (None, 2.0), (5, 1.5), (16, None)])
def test_a_sliding_or_capped_layer_matches_the_torch_backend(window: int | None, softcap: float | None) -> None:
    """Windows that start mid-block, at a block's edge and past a short context; sequences
    that share their first blocks (which a window must not read as shared)."""
    g = torch.Generator().manual_seed(3)
    pool = torch.randn(300, 2, BS, HKV, D, generator=g)
    lens = [1, 15, 16, 17, 100, 288, 33, 2, 90, 90]
    meta = _meta(lens, 300, seed=2)
    assert meta.decode_block_tables is not None
    meta.decode_block_tables[9, :5] = meta.decode_block_tables[8, :5]  # two sequences share 80 tokens
    q = torch.randn(len(lens), 8, D, generator=g) * 4  # scores large enough for the cap to bite
    ref = TorchAttentionBackend()._decode(q, pool, meta, D**-0.5, window, softcap)
    out = CPUAttentionBackend()._decode(q, pool, meta, D**-0.5, window, softcap)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-6)
    full = TorchAttentionBackend()._decode(q, pool, meta, D**-0.5)
    assert not torch.allclose(out, full, atol=1e-3)  # the window or the cap changed something


def test_the_kernel_cache_is_keyed_by_the_cpus_flags() -> None:
    # Built with -march=native: a build from another CPU must never be loaded here.
    here = cpu_flags()
    assert module_name(here) == module_name(here)
    assert module_name("avx2 fma sse4_2") != module_name("avx2 avx512f fma sse4_2")


def test_another_trees_build_is_keyed_by_every_file_and_the_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Two checkouts timed side by side must never share a build: a header alone may differ.
    here = SOURCES[0].parent
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(here, a)
    shutil.copytree(here, b)
    assert tree_module_name(a) == tree_module_name(b)
    assert tree_module_name(a) != tree_module_name(a, ("-mno-avx512f",))
    header = b / "shared_rows.h"
    header.write_text(header.read_text() + "\n// another version\n")
    assert tree_module_name(a) != tree_module_name(b)


def _shared_tables(members: list[int], shared_blocks: list[int], lens: list[int], num_blocks: int,
                   seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Block tables where the sequences of each group begin with that group's shared
    blocks, and the same tables with every sequence holding its own copies instead:
    (shared tables, private tables, with the copies' block ids)."""
    g = torch.Generator().manual_seed(seed)
    perm = iter(torch.randperm(num_blocks, generator=g).tolist())
    shared, private, i = [], [], 0
    for count, blocks in zip(members, shared_blocks):
        prefix = [next(perm) for _ in range(blocks)]
        for _ in range(count):
            own = [next(perm) for _ in range(-(-lens[i] // BS) - blocks)]
            shared.append(prefix + own)
            private.append([next(perm) for _ in prefix] + own)
            i += 1
    return shared, private


@pytest.mark.parametrize(("dtype", "heads", "dim"), [
    (torch.float32, 8, D), (torch.float32, 4, D), (torch.bfloat16, 8, D),
    (torch.float32, 8, 128),  # two 64-lane chunks of V
    (torch.float32, 8, 40),   # not a multiple of sixteen: dot4's eight-lane sums
])
def test_sequences_sharing_prefix_blocks_get_the_same_bits_as_with_copies(dtype: torch.dtype, heads: int,
                                                                          dim: int) -> None:
    # The kernel reads a shared prefix's K/V rows once for every sequence whose table
    # begins with them, computing across the members' query rows; each sequence's result
    # must be exactly what it gets alone (same dot products, same order of additions), and
    # match the torch reference. The first group's 24 query rows per KV head span more
    # than one register of rows, the others end in part-filled ones.
    members, blocks = [12, 5, 1, 3, 2, 1], [4, 6, 3, 2, 1, 0]
    lens = [70, 64, 90, 66, 80, 75, 99, 101, 67, 88, 71, 65,
            96, 100, 113, 128, 97, 60, 33, 40, 35, 19, 17, 5]
    shared, private = _shared_tables(members, blocks, lens, 600, seed=3)
    g = torch.Generator().manual_seed(4)
    pool = torch.randn(600, 2, BS, HKV, dim, generator=g).to(dtype)
    for s_row, p_row in zip(shared, private):  # the copies hold the shared blocks' data
        for a, b in zip(s_row, p_row):
            pool[b] = pool[a]
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
    width = max(len(r) for r in shared)

    def meta(rows: list[list[int]]) -> AttentionMetadata:
        zeros = torch.zeros(len(lens), dtype=torch.long)
        return AttentionMetadata(len(lens), zeros, zeros, torch.tensor([r + [0] * (width - len(r)) for r in rows]),
                                 decode_seq_lens=torch.tensor(lens))

    backend = CPUAttentionBackend()
    together = backend._decode(q, pool, meta(shared), dim**-0.5)
    alone = backend._decode(q, pool, meta(private), dim**-0.5)
    assert torch.equal(together, alone)
    ref = TorchAttentionBackend()._decode(q, pool, meta(shared), dim**-0.5)
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(together.float(), ref.float(), atol=tol, rtol=tol)
    for threads in (1, 3):  # how the items fall on threads changes nothing either
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            assert torch.equal(backend._decode(q, pool, meta(shared), dim**-0.5), together)
        finally:
            torch.set_num_threads(previous)
