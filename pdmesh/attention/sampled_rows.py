"""The last layer computed only for the rows a step samples.

A prompt's hidden states feed the next layer's K/V for every token, but past the last
layer only the rows that sample reach the LM head. So the last layer writes every row's
K/V into the pool, as every layer does, and then runs attention, its output product, the
MLP and the norms for the sampling rows alone: most of one layer's work less for every
prompt token but the last (11% of a 512-token prefill for the default 8-layer model, a
little under 1/L for an L-layer one; docs/performance/log.md section 36). The rows kept are
every decode row and, of each prefill chunk, the suffix from its first sampling row: a
suffix of a chunk is itself a chunk over a cached prefix, whose keys and values the pool
already holds."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from pdmesh.attention.backend import AttentionMetadata, PrefillSeq


@dataclass(slots=True)
class SampledRows:
    """Where the last layer stops computing every row."""

    rows: torch.Tensor
    """The step's flattened rows the last layer computes past its KV write (long, ascending)."""
    meta: AttentionMetadata
    """Attention for those rows alone: the same decode rows first, then each prefill chunk's
    kept suffix over the same blocks."""
    logits_indices: torch.Tensor
    """Each sampling row's place among ``rows``, in the step's sampling order."""


def sampled_rows(meta: AttentionMetadata, logits_indices: list[int], num_rows: int) -> SampledRows | None:
    """The last layer's rows for a step of ``num_rows`` flattened rows whose sampling rows
    are ``logits_indices``; None where every row would be kept (a step of decode rows alone)."""
    nd = meta.num_decodes
    rows = list(range(nd))
    sampling = sorted(logits_indices)
    chunks: list[PrefillSeq] = []
    chunk_ids: list[int] = []
    for i, p in enumerate(meta.prefills):
        end = p.q_start + p.q_len
        at = bisect.bisect_left(sampling, p.q_start)
        if at == len(sampling) or sampling[at] >= end:
            continue  # a chunk in mid-prompt: nothing of it samples
        first = sampling[at]
        chunks.append(PrefillSeq(len(rows), end - first, p.ctx_len, p.block_ids))
        chunk_ids.append(i)
        rows.extend(range(first, end))
    if len(rows) == num_rows:
        return None
    dev = meta.slot_blocks.device
    kept = torch.tensor(rows, dtype=torch.long, device=dev)
    place = {r: i for i, r in enumerate(rows)}
    sub = AttentionMetadata(
        num_decodes=nd,
        slot_blocks=meta.slot_blocks[kept],
        slot_offsets=meta.slot_offsets[kept],
        decode_block_tables=meta.decode_block_tables,
        decode_seq_lens=meta.decode_seq_lens,
        prefills=tuple(chunks),
    )
    if chunks and meta.prefill_tables is not None:
        sub.prefill_tables = meta.prefill_tables[chunk_ids]
        sub.prefill_spans = torch.tensor([(c.q_start, c.q_len, c.ctx_len) for c in chunks], device=dev)
    return SampledRows(kept, sub, torch.tensor([place[r] for r in logits_indices], dtype=torch.long, device=dev))
