"""A step's sequences as a compressed page index: the form GPU paged-attention kernels plan from.

flashinfer (and the kernels built like it) take a batch as CSR arrays instead of a padded
block table: where each sequence's query rows start (``qo_indptr``), where its pages start
in one flat list of page ids (``kv_indptr``, ``kv_indices``), and how full its last page is.
They plan the work split on the host, so the arrays are built here on the CPU from the
Python lists the model runner already holds, and cross to the device once per step inside
the plan, never once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class PagedIndex:
    """Host-side (CPU, int32) page index of one step; row order is the flattened batch's."""

    qo_indptr: torch.Tensor
    """[n + 1]: sequence i's query rows are ``[qo_indptr[i], qo_indptr[i + 1])``."""
    kv_indptr: torch.Tensor
    """[n + 1]: sequence i's pages are ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``."""
    kv_indices: torch.Tensor
    """The pages of every sequence, in order."""
    last_page_len: torch.Tensor
    """[n]: tokens in each sequence's last page (1..block_size)."""

    @property
    def num_seqs(self) -> int:
        return len(self.last_page_len)

    @property
    def num_rows(self) -> int:
        return int(self.qo_indptr[-1])


@dataclass(slots=True)
class PagedRow:
    """One sequence of a step: ``q_len`` query rows over a context of ``kv_len`` tokens."""

    q_len: int
    kv_len: int
    table: list[int]
    """Its block table; only the first ``ceil(kv_len / block_size)`` blocks are read."""


def paged_index(rows: list[PagedRow], block_size: int) -> PagedIndex:
    """The index of ``rows`` (decode rows first, then prefill chunks, as the step is laid out)."""
    qo = [0]
    kv = [0]
    indices: list[int] = []
    last: list[int] = []
    for row in rows:
        if row.kv_len < 1 or row.q_len < 1 or row.q_len > row.kv_len:
            raise ValueError(f"a step row needs 1 <= q_len <= kv_len, got {row.q_len} and {row.kv_len}")
        pages = -(-row.kv_len // block_size)
        if pages > len(row.table):
            raise ValueError(f"{row.kv_len} tokens need {pages} blocks; the table holds {len(row.table)}")
        qo.append(qo[-1] + row.q_len)
        indices.extend(row.table[:pages])
        kv.append(len(indices))
        last.append(row.kv_len - (pages - 1) * block_size)
    as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return PagedIndex(as_i32(qo), as_i32(kv), as_i32(indices), as_i32(last))
