"""Paged attention in plain torch (CPU, or any device without flashinfer).

Decode tokens are attended in one batched SDPA call over their gathered, padded contexts;
each prefill chunk gets its own call. A prefill without a cached prefix attends to the
chunk's own K/V with ``is_causal`` — the same call Hugging Face makes, which keeps greedy
tokens identical in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pdmesh.attention.backend import AttentionMetadata


class TorchAttentionBackend:
    """The reference backend; ``kv_layer`` is [num_blocks, 2, block_size, kv_heads, head_dim]."""

    def write_kv(
        self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> None:
        kv_layer[:, 0][meta.slot_blocks, meta.slot_offsets] = k
        kv_layer[:, 1][meta.slot_blocks, meta.slot_offsets] = v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], kv_layer, meta, scale)
        for p in meta.prefills:
            qs = q[p.q_start : p.q_start + p.q_len].transpose(0, 1).unsqueeze(0)
            if p.mask is None:
                ks = k[p.q_start : p.q_start + p.q_len].transpose(0, 1).unsqueeze(0)
                vs = v[p.q_start : p.q_start + p.q_len].transpose(0, 1).unsqueeze(0)
            else:
                ks = _gather(kv_layer[:, 0], p.block_ids, p.ctx_len).unsqueeze(0)
                vs = _gather(kv_layer[:, 1], p.block_ids, p.ctx_len).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=p.mask, is_causal=p.mask is None, scale=scale,
                enable_gqa=qs.shape[1] != ks.shape[1],
            )
            out[p.q_start : p.q_start + p.q_len] = o.squeeze(0).transpose(0, 1)
        return out

    @staticmethod
    def _decode(
        q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        tables = meta.decode_block_tables
        if tables is None or meta.decode_mask is None:
            raise RuntimeError("decode tokens scheduled without decode block tables")
        b, nblk = tables.shape
        # [B, nblk, bs, H, D] -> [B, H, nblk*bs, D]
        keys = kv_layer[:, 0][tables].reshape(b, -1, *kv_layer.shape[-2:]).transpose(1, 2)
        vals = kv_layer[:, 1][tables].reshape(b, -1, *kv_layer.shape[-2:]).transpose(1, 2)
        qs = q.unsqueeze(2)  # [B, H, 1, D]
        o = F.scaled_dot_product_attention(
            qs, keys, vals, attn_mask=meta.decode_mask, scale=scale,
            enable_gqa=qs.shape[1] != keys.shape[1],
        )
        return o.squeeze(2)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, ctx_len: int) -> torch.Tensor:
    """[H, ctx_len, D] keys (or values) of one sequence from its blocks."""
    blocks = cache[block_ids]  # [n, bs, H, D]
    return blocks.reshape(-1, *cache.shape[-2:])[:ctx_len].transpose(0, 1)
