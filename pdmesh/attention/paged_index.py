"""A step's sequences as a compressed page index: the form GPU paged-attention kernels plan from.

flashinfer (and the kernels built like it) take a batch as CSR arrays instead of a padded
block table: where each sequence's query rows start (``qo_indptr``), where its pages start
in one flat list of page ids (``kv_indptr``, ``kv_indices``), and how full its last page is.
They plan the work split on the host, so the arrays are built here on the CPU from the
Python lists the model runner already holds, and cross to the device once per step inside
the plan, never once per layer.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
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
    """The index of ``rows`` (decode rows first, then prefill chunks, as the step is laid out).

    Built with numpy from the tables' lists: at 128 rows of 4k tokens (33k page ids) a
    step's index costs 0.7-1.2 ms of host time this way, 2.0 ms through ``torch.tensor`` of
    a Python list (``scripts/probes/decode/paged_index_probe.py``, docs/performance/log.md section 49)."""
    pages = [-(-row.kv_len // block_size) for row in rows]
    for row, n in zip(rows, pages):
        if row.kv_len < 1 or row.q_len < 1 or row.q_len > row.kv_len:
            raise ValueError(f"a step row needs 1 <= q_len <= kv_len, got {row.q_len} and {row.kv_len}")
        if n > len(row.table):
            raise ValueError(f"{row.kv_len} tokens need {n} blocks; the table holds {len(row.table)}")
    counts = np.array(pages, dtype=np.int32)
    q_lens = np.fromiter((row.q_len for row in rows), dtype=np.int32, count=len(rows))
    kv_lens = np.fromiter((row.kv_len for row in rows), dtype=np.int32, count=len(rows))
    indices = np.fromiter(itertools.chain.from_iterable(itertools.islice(row.table, n) for row, n in zip(rows, pages)),
                          dtype=np.int32, count=int(counts.sum()))
    zero = np.zeros(1, dtype=np.int32)
    return PagedIndex(
        qo_indptr=torch.from_numpy(np.concatenate((zero, np.cumsum(q_lens, dtype=np.int32)))),
        kv_indptr=torch.from_numpy(np.concatenate((zero, np.cumsum(counts, dtype=np.int32)))),
        kv_indices=torch.from_numpy(indices),
        last_page_len=torch.from_numpy(kv_lens - (counts - 1) * block_size),
    )
