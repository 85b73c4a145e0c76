"""Decode steps replayed from CUDA graphs captured at start-up.

A decode step of an 8B model launches ~15 kernels per layer, ~500 in all, each a few
microseconds of work at small batch: launched one by one from Python, the GPU waits on
the host. A graph launches them all at once. Graphs have fixed shapes and addresses, so
one is captured per batch size of a ladder (``graph_batches``), over static input buffers
the step's inputs are copied into; a batch between two sizes runs the larger graph with
its extra rows padded. Padding rows read and write one scratch block that the pool holds
past the blocks the scheduler hands out, so they never touch a sequence's KV.

Attention is flashinfer's (``FlashInferBackend``): each graph has its own wrapper over
fixed index buffers, planned on the host before every replay; flashinfer's graph mode
keeps the kernel's grid the same whatever the contexts' lengths. Steps with prefill
chunks, draft verification or more rows than the largest graph run eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.flashinfer_backend import FlashInferBackend, plan
from pdmesh.attention.paged_index import PagedIndex, paged_index
from pdmesh.model.llama import LlamaForCausalLM
from pdmesh.startup import set_phase

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # what graph_pool_handle() returns

log = logging.getLogger(__name__)

LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
"""Batch sizes with a graph: powers of two to 8, then steps of 8 to 32 rows, of 16 to 128,
of 32 to 256 and of 64 beyond: a batch runs padded to less than twice its rows."""


def graph_batches(max_batch: int) -> list[int]:
    """The ladder up to ``max_batch``, which itself always gets a graph."""
    return [b for b in LADDER if b < max_batch] + [max_batch]


def padded_index(paged: PagedIndex, batch: int, scratch_block: int) -> PagedIndex:
    """``paged``'s decode rows followed by padding rows up to ``batch``, each attending one
    token of ``scratch_block``: the index a graph captured for ``batch`` rows is planned with."""
    ones = torch.ones(batch - paged.num_seqs, dtype=torch.int32)
    return PagedIndex(
        qo_indptr=torch.arange(batch + 1, dtype=torch.int32),
        kv_indptr=torch.cat([paged.kv_indptr, paged.kv_indptr[-1] + torch.cumsum(ones, 0, dtype=torch.int32)]),
        kv_indices=torch.cat([paged.kv_indices, ones * scratch_block]),
        last_page_len=torch.cat([paged.last_page_len, ones]),
    )


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    wrapper: Any
    """This graph's flashinfer wrapper, over its fixed index buffers: planned before each replay."""
    logits: torch.Tensor
    """The graph's output [batch, vocab], overwritten by each replay."""


class DecodeGraphs:
    """One captured forward pass per batch size of decode rows."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: torch.Tensor, backend: FlashInferBackend,
                 scratch_block: int, max_batch: int, max_blocks_per_seq: int) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.scratch = scratch_block
        self.max_blocks = max_blocks_per_seq
        self.block_size = kv_cache.shape[3]
        """The pool is ``[blocks, layers, K/V, block_size, kv_heads, head_dim]``."""
        self.num_heads = model.cfg.num_heads
        self.scale = model.cfg.head_dim ** -0.5
        self.batches = graph_batches(max_batch)
        dev = kv_cache.device
        top = self.batches[-1]
        self.ids = torch.zeros(top, dtype=torch.long, device=dev)
        self.positions = torch.zeros(top, dtype=torch.long, device=dev)
        self.slot_blocks = torch.full((top,), scratch_block, dtype=torch.long, device=dev)
        self.slot_offsets = torch.zeros(top, dtype=torch.long, device=dev)
        self.rows = torch.arange(top, dtype=torch.long, device=dev)
        self._graphs: dict[int, _Graph] = {}
        self.replays = 0
        """Steps served by a graph (the rest ran eagerly)."""
        set_phase(f"capturing CUDA graphs for {len(self.batches)} decode batch sizes")
        pool = torch.cuda.graph_pool_handle()
        for batch in reversed(self.batches):  # largest first: the smaller ones reuse its memory
            self._graphs[batch] = self._capture(batch, pool)
        log.info("captured CUDA graphs for decode batches %s", self.batches)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """Logits [rows, vocab] of a decode-only step, or None where no graph is large
        enough. The result is a view of the graph's output: read it before the next step."""
        rows = input_ids.shape[0]
        batch = next((b for b in self.batches if b >= rows), None)
        if batch is None:
            return None
        if meta.paged is None:
            raise RuntimeError("a graphed decode step needs its page index (AttentionMetadata.paged)")
        g = self._graphs[batch]
        with torch.inference_mode():
            self.ids[:rows].copy_(input_ids)
            self.positions[:rows].copy_(positions)
            self.slot_blocks[:rows].copy_(meta.slot_blocks)
            self.slot_offsets[:rows].copy_(meta.slot_offsets)
            self._pad(rows, batch)
            self._plan(g.wrapper, meta.paged, batch)
            g.graph.replay()
        self.replays += 1
        return g.logits[:rows]

    def _pad(self, rows: int, batch: int) -> None:
        if rows < batch:
            self.ids[rows:batch].zero_()
            self.positions[rows:batch].zero_()
            self.slot_blocks[rows:batch].fill_(self.scratch)
            self.slot_offsets[rows:batch].zero_()

    def _plan(self, wrapper: Any, paged: PagedIndex, batch: int) -> None:
        """Plan a graph's wrapper for ``paged``'s rows, padded to its ``batch``."""
        plan(wrapper, padded_index(paged, batch, self.scratch), self.num_heads, self.kv_cache[:, 0], self.scale)

    def _capture(self, batch: int, pool: _POOL_HANDLE) -> _Graph:
        dev = self.kv_cache.device
        wrapper = self.backend.new_wrapper({
            "qo_indptr_buf": torch.arange(batch + 1, dtype=torch.int32, device=dev),
            "paged_kv_indptr_buf": torch.zeros(batch + 1, dtype=torch.int32, device=dev),
            "paged_kv_indices_buf": torch.zeros(batch * self.max_blocks, dtype=torch.int32, device=dev),
            "paged_kv_last_page_len_buf": torch.zeros(batch, dtype=torch.int32, device=dev),
        })
        meta = AttentionMetadata(num_decodes=batch, slot_blocks=self.slot_blocks[:batch],
                                 slot_offsets=self.slot_offsets[:batch], attn_plan=wrapper)
        self._pad(0, batch)
        self._plan(wrapper, paged_index([], self.block_size), batch)  # padding rows alone

        def forward() -> torch.Tensor:
            return self.model(self.ids[:batch], self.positions[:batch], self.kv_cache, meta, self.backend,
                              self.rows[:batch])

        # Warm up off the capture: lazy set-up (cuBLAS handles, module loads) stays out of it.
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = forward()
        return _Graph(graph, wrapper, logits)
