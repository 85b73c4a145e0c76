"""The attention-backend interface: paged KV write + attention for a mixed batch.

A step's tokens are flattened: the first ``num_decodes`` sequences contribute one token
each, the remaining ones a prefill chunk that may sit on top of cached prefix blocks.
A backend writes the new K/V into the paged cache at the slots the model runner chose and
computes attention over each sequence's whole context. The torch and fused C++ backends
serve CPU; the flashinfer backend (``flashinfer_backend.py``) serves CUDA with the same
two methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import torch

from pdmesh.attention.paged_index import PagedIndex


@dataclass(slots=True)
class PrefillSeq:
    """One sequence's prefill chunk inside the flattened batch."""

    q_start: int
    """Offset of the chunk's first token in the flattened batch."""
    q_len: int
    ctx_len: int
    """Context after this chunk: cached/computed tokens plus the chunk."""
    block_ids: torch.Tensor
    """The blocks holding the context, in order (long)."""

    def mask(self, window: int | None = None) -> torch.Tensor | None:
        """Boolean causal mask (q_len, ctx_len), within the last ``window`` positions of
        each query when given, for a chunk that sits on a prefix or slides; None = plain
        causal. Built on demand: only the torch backend's prefill reads it."""
        start = self.ctx_len - self.q_len
        if not start and (window is None or window >= self.q_len):
            return None
        dev = self.block_ids.device
        q_pos = torch.arange(start, self.ctx_len, device=dev)[:, None]
        k_pos = torch.arange(self.ctx_len, device=dev)[None, :]
        causal = k_pos <= q_pos
        return causal if window is None else causal & (k_pos > q_pos - window)


@dataclass(slots=True)
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by all layers."""

    num_decodes: int
    slot_blocks: torch.Tensor
    """Per flattened token: the block its K/V goes to (long, shape [T])."""
    slot_offsets: torch.Tensor
    """Per flattened token: the offset inside that block (long, shape [T])."""
    decode_block_tables: torch.Tensor | None = None
    """(num_decodes, max_blocks) block ids, padded with 0."""
    decode_bias: torch.Tensor | None = None
    """(num_decodes, 1, 1, max_blocks * block_size) float32: 0 in context, -inf past it;
    built by the first layer of a backend that needs it (the fused CPU kernel does not:
    ~1 ms a step at batch 64 that it would pay for nothing)."""
    decode_seq_lens: torch.Tensor | None = None
    """(num_decodes,) int64: context length of each decode token, itself included."""
    window_biases: dict[int, torch.Tensor] | None = None
    """``decode_bias`` of each sliding window: -inf also before the window's first key;
    built by the first sliding layer of a backend that needs it."""
    prefills: tuple[PrefillSeq, ...] = ()
    prefill_tables: torch.Tensor | None = None
    """(len(prefills), max_blocks) int64: each prefill's ``block_ids``, padded with 0."""
    prefill_spans: torch.Tensor | None = None
    """(len(prefills), 3) int64: each prefill's q_start, q_len and ctx_len, for kernels
    that take every chunk of a step in one call."""
    paged: PagedIndex | None = None
    """The step as a host page index, for backends that plan from one (``wants_paged_index``)."""
    attn_plan: Any = None
    """What such a backend planned for this step: set by the first layer, read by the rest
    (or set before a CUDA graph replays the step)."""


class AttentionBackend(Protocol):
    """What a model layer calls; one instance per engine."""

    @property
    def kernels(self) -> ModuleType | None:
        """pdmesh's compiled CPU kernels when this backend runs them (the model then uses their
        fused norms and rotary embedding too), else None. Read-only here, so a backend that
        always has them may say so in its own type."""
    attends_sampled_rows: bool
    """The last layer may compute only the rows that sample (``sampled_rows.py``)."""
    wants_paged_index: bool
    """It plans from ``AttentionMetadata.paged`` and reads no padded block table."""

    def write_kv(
        self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> None:
        """Store this step's keys and values ([T, kv_heads, head_dim]) into the layer's cache."""
        ...

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention output [T, heads, head_dim] for the flattened queries ``q``: each over
        its sequence's whole context, or its last ``window`` positions; scores soft-capped
        (``softcap * tanh(s / softcap)``) when ``softcap`` is given; with ``sinks`` ([heads]),
        each head's softmax also counts its sink logit, which attends to no value."""
        ...
