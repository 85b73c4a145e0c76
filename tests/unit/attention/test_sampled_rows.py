"""The last layer computed for the sampling rows alone (``pdmesh/attention/sampled_rows.py``):
which rows it keeps, and that a step computed so gives the logits and the KV pool of a step
computed whole. The exactness tests against transformers (tests/integration/
test_engine_exact.py) run every prefill through it on the fused backend."""

from __future__ import annotations

from pathlib import Path

import torch

from pdmesh import LLM
from pdmesh.attention.backend import AttentionMetadata, PrefillSeq
from pdmesh.attention.sampled_rows import sampled_rows
from pdmesh.engine.model_runner import _padded


def _meta(decodes: list[tuple[list[int], int]], chunks: list[tuple[list[int], int, int]], bs: int) -> AttentionMetadata:
    """A step's metadata as the model runner builds it: ``decodes`` as (block table, position),
    then ``chunks`` as (block table, first position, tokens)."""
    slots: list[int] = []
    pos: list[int] = []
    for table, p in decodes:
        slots.append(table[p // bs])
        pos.append(p)
    spans, tables = [], []
    for table, start, n in chunks:
        spans.append((len(pos), n, start + n))
        tables.append(table)
        slots.extend(table[p // bs] for p in range(start, start + n))
        pos.extend(range(start, start + n))
    meta = AttentionMetadata(num_decodes=len(decodes), slot_blocks=torch.tensor(slots),
                             slot_offsets=torch.tensor(pos) % bs)
    if decodes:
        meta.decode_block_tables = _padded([t for t, _ in decodes], "cpu")
        meta.decode_seq_lens = torch.tensor([p + 1 for _, p in decodes])
    if chunks:
        meta.prefill_tables = _padded(tables, "cpu")
        meta.prefill_spans = torch.tensor(spans)
        meta.prefills = tuple(PrefillSeq(s, n, c, meta.prefill_tables[i, : len(tables[i])])
                              for i, (s, n, c) in enumerate(spans))
    return meta


def test_decode_rows_and_each_chunks_suffix_from_its_first_sampling_row_are_kept() -> None:
    meta = _meta([([1], 3), ([2], 5)], [([3], 0, 5), ([4], 8, 4), ([5, 6], 0, 3)], bs=16)
    # rows: decodes 0, 1; chunk 2-6 samples its last; chunk 7-10 is mid-prompt; 11-13 all sample
    last = sampled_rows(meta, [0, 12, 1, 6, 11, 13], 14)
    assert last is not None
    assert last.rows.tolist() == [0, 1, 6, 11, 12, 13]
    assert last.logits_indices.tolist() == [0, 4, 1, 2, 3, 5]  # the caller's order, new places
    assert last.meta.num_decodes == 2 and torch.equal(last.meta.decode_block_tables, meta.decode_block_tables)
    assert [(p.q_start, p.q_len, p.ctx_len) for p in last.meta.prefills] == [(2, 1, 5), (3, 3, 3)]
    assert last.meta.prefill_spans.tolist() == [[2, 1, 5], [3, 3, 3]]
    assert torch.equal(last.meta.prefill_tables, meta.prefill_tables[[0, 2]])
    assert torch.equal(last.meta.slot_blocks, meta.slot_blocks[last.rows])


def test_a_step_where_every_row_samples_is_left_whole() -> None:
    meta = _meta([([1], 3), ([2], 5)], [([3], 0, 1)], bs=16)
    assert sampled_rows(meta, [0, 1, 2], 3) is None


def test_logits_and_kv_pool_equal_a_step_computed_whole(llama_dir: Path) -> None:
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=32, block_size=16)
    runner = llm.engine.runner
    assert runner.backend.attends_sampled_rows
    model, backend, bs = runner.model, runner.backend, runner.block_size
    g = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, 1000, (n,), generator=g).tolist()

    def forward(ids: list[int], positions: list[int], meta: AttentionMetadata, logits: list[int],
                pool: torch.Tensor, cut: bool) -> torch.Tensor:
        last = sampled_rows(meta, logits, len(ids)) if cut else None
        assert (last is not None) == cut
        return model(torch.tensor(ids), torch.tensor(positions), pool, meta, backend, torch.tensor(logits), last)

    pool = torch.zeros_like(runner.kv_cache)
    # A 20-token prompt in blocks 1-2, its last layer cut: the decode row's context next.
    forward(tokens(20), list(range(20)), _meta([], [([1, 2], 0, 20)], bs), [19], pool, cut=True)
    # A decode row of it, a 40-token prompt that samples and a 24-token chunk that does not.
    mixed = _meta([([1, 2], 20)], [([3, 4, 5], 0, 40), ([6, 7], 0, 24)], bs)
    ids, positions = tokens(1) + tokens(40) + tokens(24), [20, *range(40), *range(24)]
    whole_pool, cut_pool = pool.clone(), pool.clone()
    whole = forward(ids, positions, mixed, [0, 40], whole_pool, cut=False)
    cut = forward(ids, positions, mixed, [0, 40], cut_pool, cut=True)
    assert torch.equal(cut_pool, whole_pool)  # every layer's K/V of every row, bit for bit
    torch.testing.assert_close(cut, whole, rtol=1e-4, atol=1e-4)
    assert torch.equal(cut.argmax(-1), whole.argmax(-1))
