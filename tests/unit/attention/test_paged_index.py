"""The page index flashinfer plans from describes the same attention as the block tables the
torch backend reads: a naive attention over the index equals the torch backend's output on
a mixed step (decode rows, a fresh prefill chunk, a chunk over a cached prefix)."""

from __future__ import annotations

import pytest
import torch

from pdmesh.attention.backend import AttentionMetadata, PrefillSeq
from pdmesh.attention.paged_index import PagedIndex, PagedRow, paged_index
from pdmesh.attention.torch_backend import TorchAttentionBackend

BS, HEADS, KV_HEADS, DIM = 4, 4, 2, 8


def naive_attention(q: torch.Tensor, kv_layer: torch.Tensor, index: PagedIndex, scale: float) -> torch.Tensor:
    """Each sequence's query rows over its pages, causal and aligned to its last token, as
    flashinfer's batch prefill with causal=True computes it."""
    out = torch.empty_like(q)
    group = HEADS // KV_HEADS
    for i in range(index.num_seqs):
        q0, q1 = int(index.qo_indptr[i]), int(index.qo_indptr[i + 1])
        pages = index.kv_indices[int(index.kv_indptr[i]) : int(index.kv_indptr[i + 1])].long()
        kv_len = (len(pages) - 1) * BS + int(index.last_page_len[i])
        k = kv_layer[pages, 0].reshape(-1, KV_HEADS, DIM)[:kv_len].repeat_interleave(group, 1)
        v = kv_layer[pages, 1].reshape(-1, KV_HEADS, DIM)[:kv_len].repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q[q0:q1], k) * scale
        q_pos = torch.arange(kv_len - (q1 - q0), kv_len)[:, None]
        scores.masked_fill_(torch.arange(kv_len)[None, :] > q_pos, float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def test_a_mixed_step_attends_the_same_through_the_index_and_the_block_tables() -> None:
    g = torch.Generator().manual_seed(0)
    kv_layer = torch.randn(40, 2, BS, KV_HEADS, DIM, generator=g)
    perm = torch.randperm(40, generator=g).tolist()
    # Two decode rows (contexts 9 and 4, the second on a table with a spare block), then a
    # 5-token chunk without prefix and a 3-token chunk over a 10-token cached prefix.
    decode = [(perm[0:3], 9), (perm[3:5], 4)]
    prefill = [(perm[5:7], 5, 5), (perm[7:11], 3, 13)]
    rows = [PagedRow(1, n, t) for t, n in decode] + [PagedRow(q, ctx, t) for t, q, ctx in prefill]
    index = paged_index(rows, BS)
    assert index.qo_indptr.tolist() == [0, 1, 2, 7, 10]
    assert index.kv_indptr.tolist() == [0, 3, 4, 6, 10]
    assert index.kv_indices.tolist() == perm[0:3] + perm[3:4] + perm[5:7] + perm[7:11]
    assert index.last_page_len.tolist() == [1, 4, 1, 1]
    # int32 throughout: flashinfer picks its kernel module by the index dtype (int32 is the one built ahead)
    assert {t.dtype for t in (index.qo_indptr, index.kv_indptr, index.kv_indices, index.last_page_len)} == {torch.int32}

    total = index.num_rows
    q = torch.randn(total, HEADS, DIM, generator=g)
    width = max(len(t) for t, _ in decode)
    meta = AttentionMetadata(
        num_decodes=2, slot_blocks=torch.zeros(total, dtype=torch.long),
        slot_offsets=torch.zeros(total, dtype=torch.long),
        decode_block_tables=torch.tensor([t + [0] * (width - len(t)) for t, _ in decode]),
        decode_seq_lens=torch.tensor([n for _, n in decode]),
        prefills=(PrefillSeq(2, 5, 5, torch.tensor(perm[5:7])), PrefillSeq(7, 3, 13, torch.tensor(perm[7:11]))),
    )
    # The torch backend attends a prefix-free chunk to the chunk's own K/V: hand it those rows.
    k = torch.zeros(total, KV_HEADS, DIM)
    v = torch.zeros(total, KV_HEADS, DIM)
    k[2:7] = kv_layer[perm[5:7], 0].reshape(-1, KV_HEADS, DIM)[:5]
    v[2:7] = kv_layer[perm[5:7], 1].reshape(-1, KV_HEADS, DIM)[:5]
    want = TorchAttentionBackend().attend(q, k, v, kv_layer, meta, DIM**-0.5)
    torch.testing.assert_close(naive_attention(q, kv_layer, index, DIM**-0.5), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("row", "error"), [
    (PagedRow(2, 1, [3]), "q_len <= kv_len"),
    (PagedRow(1, 9, [3, 4]), "9 tokens need 3 blocks"),
])
def test_a_row_the_kernels_cannot_read_is_refused(row: PagedRow, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        paged_index([row], BS)


def test_a_graph_pads_its_rows_onto_the_scratch_block() -> None:
    from pdmesh.engine.cuda_graphs import padded_index

    real = paged_index([PagedRow(1, 9, [5, 6, 7]), PagedRow(1, 4, [8])], BS)
    padded = padded_index(real, 5, scratch_block=40)
    assert padded.qo_indptr.tolist() == [0, 1, 2, 3, 4, 5]
    assert padded.kv_indptr.tolist() == [0, 3, 4, 5, 6, 7]
    assert padded.kv_indices.tolist() == [5, 6, 7, 8, 40, 40, 40]
    assert padded.last_page_len.tolist() == [1, 4, 1, 1, 1]
    assert {t.dtype for t in (padded.qo_indptr, padded.kv_indptr, padded.kv_indices, padded.last_page_len)} == {
        torch.int32}
    capture = padded_index(paged_index([], BS), 2, scratch_block=40)  # what a graph is captured with
    assert (capture.kv_indptr.tolist(), capture.kv_indices.tolist()) == ([0, 1, 2], [40, 40])
