"""Paged attention on CPU with pdmesh's fused C++ kernels (``csrc/``).

KV writes go row by row into their slots (``kv_write.cpp``; torch's two advanced-index
assignments per layer cost more than the copy itself, section 23). Decode tokens attend
straight over the block tables instead of gathering and permuting every context per
layer, which the profile showed to cost more than the attention math itself
(docs/performance/log.md, section 10); float32 prefill chunks likewise read their cached
prefix where it lies, all of a step's chunks in one call (``paged_prefill.cpp``, section
18). Other dtypes and head sizes prefill through the torch backend's SDPA calls, as do
sliding-window and soft-capped layers (the decode kernel reads only a sliding layer's
window, and caps scores itself); layers with attention sinks attend through the torch
backend in decode too.
"""

from __future__ import annotations

from types import ModuleType

import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.cpu_kernels import load
from pdmesh.attention.torch_backend import TorchAttentionBackend


class CPUAttentionBackend(TorchAttentionBackend):
    attends_sampled_rows = True
    """The fused prefill kernel computes each query row over the pool alone, whatever the
    chunk's other rows; the torch fallback (other dtypes) attends a suffix through its
    masked path, over the same pool."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(f"the cpu attention backend runs on the CPU, not {device}")
        super().__init__(device)
        self.kernels: ModuleType = load()
        """Also the model's fused norms and rotary embedding (``use_kernels``)."""
        built = hasattr(self.kernels, "paged_prefill_")
        self._prefill_tile = (self.kernels.paged_prefill_tile_rows(), self.kernels.paged_prefill_lanes()) \
            if built else None
        """The prefill kernel's query rows per tile and float32 lanes per vector; None
        where it was not built (no AVX2)."""

    def write_kv(
        self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> None:
        self.kernels.write_kv_(kv_layer, k, v, meta.slot_blocks, meta.slot_offsets)

    def _decode(
        self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if sinks is not None:
            return super()._decode(q, kv_layer, meta, scale, window, softcap, sinks)
        if meta.decode_block_tables is None or meta.decode_seq_lens is None:
            raise RuntimeError("decode tokens scheduled without decode block tables")
        return self.kernels.paged_decode(q.contiguous(), kv_layer, meta.decode_block_tables,
                                          meta.decode_seq_lens, scale, window or 0, softcap or 0.0)

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        if window is not None or softcap is not None or sinks is not None or not self.prefill_kernel_takes(q, kv_layer):
            super()._prefill(q, k, v, kv_layer, meta, scale, out, window, softcap, sinks)
            return
        if meta.prefill_tables is None or meta.prefill_spans is None:
            raise RuntimeError("prefill chunks scheduled without prefill tables")
        self.kernels.paged_prefill_(out, q.contiguous(), kv_layer, meta.prefill_tables,
                                    meta.prefill_spans, scale)

    def prefill_kernel_takes(self, q: torch.Tensor, kv_layer: torch.Tensor) -> bool:
        """Whether the fused prefill kernel computes these shapes: float32, a head_dim that
        is a multiple of its vector width, and no more query heads per KV head than its
        tile has rows."""
        if self._prefill_tile is None:
            return False
        rows, lanes = self._prefill_tile
        heads, dim, kv_heads = q.shape[1], q.shape[2], kv_layer.shape[3]
        return (q.dtype == torch.float32 and kv_layer.dtype == torch.float32 and dim % lanes == 0
                and heads % kv_heads == 0 and heads // kv_heads <= rows)
