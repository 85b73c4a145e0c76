"""The fused CPU prefill kernel against the torch backend's SDPA calls: chunks with and
without a cached prefix, tiles cut mid-chunk, GQA groups, several chunks in one call."""

from __future__ import annotations

import pytest
import torch

from pdmesh.attention.backend import AttentionMetadata, PrefillSeq
from pdmesh.attention.cpu_backend import CPUAttentionBackend
from pdmesh.attention.cpu_kernels import load
from pdmesh.attention.torch_backend import TorchAttentionBackend
from pdmesh.cpu import cpu_flags

BS = 16
AVX2 = {"avx2", "fma"} <= set(cpu_flags().split())
needs_kernel = pytest.mark.skipif(not AVX2, reason="the prefill kernel is built only for CPUs with AVX2 and FMA")


def test_the_kernel_exists_exactly_where_the_cpu_has_avx2() -> None:
    assert hasattr(load(), "paged_prefill_") == AVX2


def _step(chunks: list[tuple[int, int]], pool: torch.Tensor, seed: int) -> tuple[AttentionMetadata, torch.Tensor,
                                                                                 torch.Tensor]:
    """Metadata for prefill chunks (q_len, ctx_len) on scattered blocks of ``pool``, and
    each chunk's own K and V rows ([tokens, kv_heads, head_dim]) read back from the pool,
    as the model's ``write_kv`` would have left them."""
    perm = torch.randperm(pool.shape[0], generator=torch.Generator().manual_seed(seed)).tolist()
    prefills, tables, spans, used, q_start = [], [], [], 0, 0
    for q_len, ctx in chunks:
        ids = perm[used : used + -(-ctx // BS)]
        used += len(ids)
        prefills.append(PrefillSeq(q_start, q_len, ctx, torch.tensor(ids)))
        tables.append(ids)
        spans.append((q_start, q_len, ctx))
        q_start += q_len
    width = max(len(t) for t in tables)
    zeros = torch.zeros(q_start, dtype=torch.long)
    meta = AttentionMetadata(0, zeros, zeros, prefills=tuple(prefills),
                             prefill_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
                             prefill_spans=torch.tensor(spans))
    pos = [(p.block_ids[t // BS], t % BS) for p in prefills for t in range(p.ctx_len - p.q_len, p.ctx_len)]
    k = torch.stack([pool[b, 0, o] for b, o in pos])
    v = torch.stack([pool[b, 1, o] for b, o in pos])
    return meta, k, v


CHUNKS = [(64, 576), (1, 17), (37, 37), (100, 300), (16, 16), (5, 600), (130, 130)]


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "dim"),
                         [(8, 4, 64), (4, 4, 16), (4, 2, 32), (6, 2, 16), (8, 2, 128)])
def test_kernel_matches_sdpa(heads: int, kv_heads: int, dim: int) -> None:
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(400, 3, 2, BS, kv_heads, dim, generator=g)[:, 1]  # a strided layer view
    meta, k, v = _step(CHUNKS, pool, seed=1)
    q = torch.randn(k.shape[0], heads, dim, generator=g)
    backend = CPUAttentionBackend()
    assert backend.prefill_kernel_takes(q, pool)
    ref = TorchAttentionBackend().attend(q, k, v, pool, meta, dim**-0.5)
    out = backend.attend(q, k, v, pool, meta, dim**-0.5)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-6)


@needs_kernel
def test_results_do_not_depend_on_the_thread_count() -> None:
    g = torch.Generator().manual_seed(2)
    pool = torch.randn(400, 2, BS, 4, 64, generator=g)
    meta, k, v = _step(CHUNKS, pool, seed=3)
    q = torch.randn(k.shape[0], 8, 64, generator=g)
    backend, threads = CPUAttentionBackend(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = backend.attend(q, k, v, pool, meta, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, backend.attend(q, k, v, pool, meta, 0.125))


def test_other_dtypes_prefill_through_sdpa() -> None:
    g = torch.Generator().manual_seed(4)
    pool = torch.randn(100, 2, BS, 2, 16, generator=g).to(torch.bfloat16)
    meta, k, v = _step([(20, 52), (9, 9)], pool, seed=5)
    q = torch.randn(k.shape[0], 4, 16, generator=g).to(torch.bfloat16)
    backend = CPUAttentionBackend()
    assert not backend.prefill_kernel_takes(q, pool)
    ref = TorchAttentionBackend().attend(q, k, v, pool, meta, 0.25)
    assert torch.equal(backend.attend(q, k, v, pool, meta, 0.25), ref)


@needs_kernel
def test_queries_from_a_transposed_product_are_taken() -> None:
    """Up to 256 rows the model's linear product returns a transposed view, so q (and
    anything shaped like it) can arrive with strided rows; the kernel writes rows of a
    contiguous output either way (a draft model's short prefill chunks hit this in CI)."""
    g = torch.Generator().manual_seed(6)
    pool = torch.randn(200, 2, BS, 2, 16, generator=g)
    meta, k, v = _step([(9, 41), (12, 12)], pool, seed=7)
    tokens = k.shape[0]
    w, x = torch.randn(4 * 16, 32, generator=g), torch.randn(tokens, 32, generator=g)
    q = torch.mm(w, x.t()).t().view(tokens, 4, 16)
    assert not q.is_contiguous()
    ref = TorchAttentionBackend().attend(q, k, v, pool, meta, 0.25)
    torch.testing.assert_close(CPUAttentionBackend().attend(q, k, v, pool, meta, 0.25), ref,
                               atol=2e-6, rtol=2e-6)
