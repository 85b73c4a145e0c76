"""Paged attention on CPU with the fused C++ decode kernel (``csrc/paged_attention.cpp``).

Prefill chunks and KV writes are the torch backend's (one SDPA call per chunk, the call
Hugging Face makes); decode tokens attend straight over the block tables instead of
gathering and permuting every context per layer, which the profile showed to cost more
than the attention math itself (docs/performance.md).
"""

from __future__ import annotations

import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.cpu_kernels import load
from pdmesh.attention.torch_backend import TorchAttentionBackend


class CPUAttentionBackend(TorchAttentionBackend):
    def __init__(self, device: str | torch.device = "cpu") -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(f"the cpu attention backend runs on the CPU, not {device}")
        super().__init__(device)
        self.kernels = load()
        """Also the model's fused norms and rotary embedding (``use_kernels``)."""

    def _decode(
        self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        if meta.decode_block_tables is None or meta.decode_seq_lens is None:
            raise RuntimeError("decode tokens scheduled without decode block tables")
        return self.kernels.paged_decode(q.contiguous(), kv_layer, meta.decode_block_tables,
                                          meta.decode_seq_lens, scale)
