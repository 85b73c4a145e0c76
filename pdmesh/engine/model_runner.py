"""Turns a ``SchedulerOutput`` into tensors, runs the model and returns sampling logits.

The KV pool is one tensor ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]``:
one block across all layers is contiguous, so a block is a single NIXL descriptor when KV
moves between workers. Decode sequences are placed first in the flattened batch so the
attention backend can serve them in one batched call. A sequence verifying draft tokens
is k + 1 decode rows sharing one block table, row ``i`` seeing ``start + i + 1`` tokens:
the same kernel and arithmetic as k + 1 ordinary decode steps, in one forward pass.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from pdmesh.attention.backend import AttentionBackend, AttentionMetadata, PrefillSeq
from pdmesh.attention.flashinfer_backend import FlashInferBackend
from pdmesh.attention.paged_index import PagedRow, paged_index
from pdmesh.attention.sampled_rows import SampledRows, sampled_rows
from pdmesh.engine.kv_pool import kv_pool
from pdmesh.engine.scheduler import ScheduledSeq, SchedulerOutput
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.kv.layout import KVLayout
from pdmesh.model.config import ModelConfig
from pdmesh.model.llama import LlamaForCausalLM
from pdmesh.request import Sequence

if TYPE_CHECKING:
    from pdmesh.engine.cuda_graphs import DecodeGraphs

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StepResult:
    logits: torch.Tensor
    """Float32, one row per sampled position: ``len(drafts[i]) + 1`` rows for sequence i."""
    sampling: list[Sequence]
    """The sequences whose next token these rows produce, in row order."""
    drafts: list[list[int]]
    """Per sampling sequence, the draft tokens this step verified (mostly empty)."""
    prompt_logits: torch.Tensor | None = None
    """Rows for prompt logprobs, after the sampling rows: ``prompt_rows`` says whose."""
    prompt_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)
    """``(sequence, first position, rows)``: position ``p``'s row predicts prompt token ``p + 1``."""


@dataclass(slots=True)
class PreparedStep:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_idx: torch.Tensor
    sampling: list[Sequence]
    drafts: list[list[int]]
    last: SampledRows | None = None
    """The last layer's rows where it computes fewer than all (``sampled_rows``)."""
    decode_only: bool = False
    """One sampling row per sequence and no drafts: a step a CUDA graph can replay."""
    prompt_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)
    """Prompt positions whose logits a request's prompt logprobs need (``StepResult``)."""


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        cfg: ModelConfig,
        dtype: torch.dtype,
        num_blocks: int,
        block_size: int,
        kv: KVCacheManager,
        backend: AttentionBackend,
        device: str = "cpu",
        cuda_graphs: CudaGraphSizes | None = None,
    ) -> None:
        """``cuda_graphs``: capture decode graphs (flashinfer on CUDA only) up to that many
        rows, each row's context up to ``max_model_len`` tokens."""
        self.model = model
        self.cfg = cfg
        self.block_size = block_size
        self.kv = kv
        self.backend = backend
        model.use_kernels(backend.kernels)
        mode = os.environ.get("PDMESH_ONEDNN", "auto")  # auto (measured here), always, 0
        if device == "cpu" and dtype == torch.float32 and mode != "0":
            model.use_linear_plan(always_onednn=mode == "always")
        self.device = torch.device(device)
        layout = KVLayout.for_model(cfg, block_size, str(dtype).removeprefix("torch."))
        graphed = backend if cuda_graphs is not None and isinstance(backend, FlashInferBackend) else None
        if cuda_graphs is not None and graphed is None and self.device.type == "cuda":
            log.warning("CUDA graphs need the flashinfer attention backend; decode steps run eagerly")
        # With graphs the pool holds one block past the scheduler's: padding rows' scratch.
        pool_blocks = num_blocks + (1 if graphed is not None else 0)
        self.kv_cache, self.kv_pages = kv_pool((pool_blocks, *layout.block_shape), dtype, self.device)
        self.graphs: DecodeGraphs | None = None
        if graphed is not None and cuda_graphs is not None:  # (both: for the type checker)
            from pdmesh.engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, self.kv_cache, graphed, num_blocks, cuda_graphs.max_batch,
                                       -(-cuda_graphs.max_model_len // block_size))

    def prepare(self, out: SchedulerOutput) -> PreparedStep:
        """Everything read from the block tables; needs the engine lock."""
        for copy in out.copies:
            self.kv_cache[copy.dst] = self.kv_cache[copy.src]
        items = sorted(out.scheduled, key=lambda s: s.num_new_tokens != 1 and not s.spec)
        return self._prepare(items)

    def forward(self, step: PreparedStep) -> StepResult:
        """The model itself; touches only the blocks of scheduled sequences (no lock needed)."""
        if self.graphs is not None and step.decode_only:
            logits = self.graphs.run(step.input_ids, step.positions, step.meta)
            if logits is not None:
                return StepResult(logits, step.sampling, step.drafts)
        logits = self.model(step.input_ids, step.positions, self.kv_cache, step.meta, self.backend,
                            step.logits_idx, step.last)
        if step.prompt_rows:
            n = sum(rows for _, _, rows in step.prompt_rows)
            return StepResult(logits[:-n], step.sampling, step.drafts, logits[-n:], step.prompt_rows)
        return StepResult(logits, step.sampling, step.drafts)

    def _prepare(self, items: list[ScheduledSeq]) -> PreparedStep:
        bs = self.block_size
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        slot_blocks: list[int] = []
        logits_idx: list[int] = []
        sampling: list[Sequence] = []
        drafts: list[list[int]] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_spans: list[tuple[int, int, int]] = []
        prefill_tables: list[list[int]] = []
        prompt_rows: list[tuple[Sequence, int, int]] = []
        prompt_idx: list[int] = []
        for item in items:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            table = self.kv.block_table(seq)
            q_start = len(ids)
            ids.extend(seq.token_ids[start : start + n - len(item.spec)])
            ids.extend(item.spec)
            pos.extend(range(start, start + n))
            slot_blocks.extend(table[p // bs] for p in range(start, start + n))
            if n == 1 or item.spec:
                for i in range(n):
                    decode_tables.append(table)
                    decode_lens.append(start + i + 1)
                if item.spec:
                    logits_idx.extend(range(q_start, q_start + n - 1))
            else:
                ctx = start + n
                prefill_spans.append((q_start, n, ctx))
                prefill_tables.append(table[: -(-ctx // bs)])
            if item.samples:
                logits_idx.append(len(ids) - 1)
                sampling.append(seq)
                drafts.append(item.spec)
            if seq.params.prompt_logprobs is not None and seq.index == 0 and not item.spec:
                first = max(start, len(seq.prompt_logprobs))  # a recompute after preemption: not again
                end = min(start + n, seq.prompt_len - 1)
                if first < end:
                    prompt_rows.append((seq, first, end - first))
                    prompt_idx.extend(range(q_start + first - start, q_start + end - start))
        positions = torch.tensor(pos, device=dev)
        meta = AttentionMetadata(
            num_decodes=len(decode_tables),
            slot_blocks=torch.tensor(slot_blocks, device=dev),
            slot_offsets=positions % bs,
        )
        if self.backend.wants_paged_index:
            meta.paged = paged_index([PagedRow(1, n, t) for t, n in zip(decode_tables, decode_lens)]
                                     + [PagedRow(n, ctx, t) for (_, n, ctx), t in zip(prefill_spans, prefill_tables)],
                                     bs)
        else:
            _block_tables(meta, decode_tables, decode_lens, prefill_spans, prefill_tables, dev)
        logits_idx += prompt_idx  # after the sampling rows: StepResult splits them off
        cut = self.backend.attends_sampled_rows and prefill_spans
        last = sampled_rows(meta, logits_idx, len(ids)) if cut else None
        decode_only = not prefill_spans and not any(drafts) and len(logits_idx) == len(ids)
        return PreparedStep(torch.tensor(ids, device=dev), positions, meta,
                            torch.tensor(logits_idx, dtype=torch.long, device=dev), sampling, drafts, last,
                            decode_only, prompt_rows)


@dataclass(frozen=True, slots=True)
class CudaGraphSizes:
    """What decode graphs must hold: rows per step and tokens per row."""

    max_batch: int
    max_model_len: int


def _block_tables(meta: AttentionMetadata, decode_tables: list[list[int]], decode_lens: list[int],
                  prefill_spans: list[tuple[int, int, int]], prefill_tables: list[list[int]],
                  dev: torch.device) -> None:
    """The padded block tables the torch and CPU backends read. A backend that plans from
    the page index never reads them, and at 128 rows of 4k tokens they cost 6.7 ms of host
    time per step (``scripts/probes/decode/paged_index_probe.py``, docs/performance/log.md section 49)."""
    if decode_tables:
        meta.decode_block_tables = _padded(decode_tables, dev)
        meta.decode_seq_lens = torch.tensor(decode_lens, device=dev)
    if prefill_spans:
        tables = meta.prefill_tables = _padded(prefill_tables, dev)
        meta.prefill_spans = torch.tensor(prefill_spans, device=dev)
        meta.prefills = tuple(PrefillSeq(q_start, n, ctx, tables[i, : len(used)])  # rows: no tensor each
                              for i, ((q_start, n, ctx), used) in enumerate(zip(prefill_spans, prefill_tables)))


def _padded(tables: list[list[int]], dev: torch.device | str) -> torch.Tensor:
    """Block tables as one int64 tensor, each row padded with block 0 to the longest.

    Filled through numpy from one flat run of the ids: 4.3-4.6x faster than
    ``torch.tensor`` of padded lists (64 rows of 65 blocks 0.14 against 0.59 ms, 128 of
    261 0.91 against 4.2 ms on a 2-core Zen 4), host time every decode step."""
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    width = int(lens.max())
    flat = np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int64, count=int(lens.sum()))
    padded = np.zeros((len(tables), width), dtype=np.int64)
    padded[np.arange(width) < lens[:, None]] = flat
    return torch.from_numpy(padded).to(dev)
