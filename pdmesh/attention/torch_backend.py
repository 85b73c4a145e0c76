"""Paged attention in plain torch (CPU, or any device without flashinfer).

Decode tokens are attended with two batched matmuls over their gathered, padded contexts;
each prefill chunk gets its own call. A prefill without a cached prefix attends to the
chunk's own K/V with ``is_causal`` — the same call Hugging Face makes, which keeps greedy
tokens identical in float32. A sliding layer masks keys before its window; soft-capped
scores (Gemma 2) and attention sinks (gpt-oss) take transformers' eager formulation, which
SDPA cannot express.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from pdmesh.attention.backend import AttentionMetadata


class TorchAttentionBackend:
    """The reference backend; ``kv_layer`` is [num_blocks, 2, block_size, kv_heads, head_dim]."""

    attends_sampled_rows = False
    """A chunk without a cached prefix attends with ``is_causal`` as Hugging Face does; its
    last row alone would go through the masked path instead, a different SDPA kernel."""
    wants_paged_index = False
    """It reads the padded block tables (``decode_block_tables``, ``prefills``)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self._device = torch.device(device)
        self._buffers: dict[str, torch.Tensor] = {}
        self.kernels: ModuleType | None = None
        """No fused kernels: the model runs its norms and rotary embedding in torch ops."""

    def write_kv(
        self, kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> None:
        write_kv_slots(kv_layer, k, v, meta)

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
        # Contiguous whatever q's layout (a transposed linear product hands over strided
        # rows): the fused kernels write rows of it in place.
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], kv_layer, meta, scale, window, softcap, sinks)
        if meta.prefills:
            self._prefill(q, k, v, kv_layer, meta, scale, out, window, softcap, sinks)
        return out

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
        """Every prefill chunk's rows of ``out``: one SDPA call per chunk."""
        for p in meta.prefills:
            qs = _rows(q, p.q_start, p.q_len).transpose(0, 1).unsqueeze(0)
            mask = p.mask(window)
            if p.ctx_len == p.q_len:  # no cached prefix: the chunk's own keys
                ks = _rows(k, p.q_start, p.q_len).transpose(0, 1).unsqueeze(0)
                vs = _rows(v, p.q_start, p.q_len).transpose(0, 1).unsqueeze(0)
            else:
                ks = _gather(kv_layer[:, 0], p.block_ids, p.ctx_len).unsqueeze(0)
                vs = _gather(kv_layer[:, 1], p.block_ids, p.ctx_len).unsqueeze(0)
            if softcap is not None or sinks is not None:
                o = _eager_attention(qs, ks, vs, mask, scale, softcap, sinks)
            else:
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scale,
                    enable_gqa=qs.shape[1] != ks.shape[1],
                )
            out[p.q_start : p.q_start + p.q_len] = o.squeeze(0).transpose(0, 1)

    def _decode(
        self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Batched decode as two matmuls over gathered, head-major contexts. The gathers
        # write into persistent workspaces: fresh multi-MB temporaries every layer cost
        # more in page faults than the attention math itself on CPU.
        tables, lens = meta.decode_block_tables, meta.decode_seq_lens
        if tables is None or lens is None:
            raise RuntimeError("decode tokens scheduled without decode block tables")
        b, nblk = tables.shape
        _, _, bs, hkv, d = kv_layer.shape
        bias = decode_bias(meta, lens, nblk * bs, window)
        group = q.shape[1] // hkv
        flat = tables.view(-1)
        keys = self._head_major(kv_layer[:, 0], flat, b, nblk, "k")
        scores = torch.matmul(q.view(b, hkv, group, d), keys.transpose(-1, -2))
        scores = scores.float().mul_(scale)
        if softcap is not None:
            scores.div_(softcap).tanh_().mul_(softcap)
        scores.add_(bias)
        if sinks is not None:
            probs = _with_sinks(scores, sinks.float().view(1, hkv, group, 1)).to(q.dtype)
        else:
            probs = torch.softmax(scores, dim=-1).to(q.dtype)
        values = self._head_major(kv_layer[:, 1], flat, b, nblk, "v")
        return torch.matmul(probs, values).view(b, hkv * group, d)

    def _head_major(
        self, cache: torch.Tensor, flat_tables: torch.Tensor, b: int, nblk: int, name: str
    ) -> torch.Tensor:
        """[b, kv_heads, nblk * block_size, head_dim] context gathered from the blocks."""
        _, bs, hkv, d = cache.shape
        numel = b * nblk * bs * hkv * d
        gathered = self._workspace(name + "_gather", numel, cache.dtype).view(b * nblk, bs, hkv, d)
        torch.index_select(cache, 0, flat_tables, out=gathered)
        out = self._workspace(name, numel, cache.dtype).view(b, hkv, nblk, bs, d)
        out.copy_(gathered.view(b, nblk, bs, hkv, d).permute(0, 3, 1, 2, 4))
        return out.view(b, hkv, nblk * bs, d)

    def _workspace(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = torch.empty(max(numel, 2 * (buf.numel() if buf is not None else 0)), dtype=dtype,
                              device=self._device)
            self._buffers[name] = buf
        return buf[:numel]


def write_kv_slots(kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
    """Each row's key and value into its slot (``meta.slot_blocks``, ``meta.slot_offsets``):
    two indexed assignments, which a CUDA graph captures as they are."""
    kv_layer[:, 0][meta.slot_blocks, meta.slot_offsets] = k
    kv_layer[:, 1][meta.slot_blocks, meta.slot_offsets] = v


def decode_bias(meta: AttentionMetadata, lens: torch.Tensor, keys: int, window: int | None = None) -> torch.Tensor:
    """The additive mask [decodes, 1, 1, keys] of a step's decode scores: -inf at each
    token's padding past its length and, with ``window``, before its last ``window``
    positions. Built once per step and window, shared by every layer that attends so."""
    if window is None and meta.decode_bias is not None:
        return meta.decode_bias
    if window is not None and meta.window_biases is not None and window in meta.window_biases:
        return meta.window_biases[window]
    pos = torch.arange(keys, device=lens.device)[None, :]
    outside = pos >= lens[:, None]
    if window is not None:
        outside |= pos < lens[:, None] - window
    bias = torch.zeros((lens.shape[0], 1, 1, keys), device=lens.device).masked_fill_(
        outside[:, None, None, :], float("-inf"))
    if window is None:
        meta.decode_bias = bias
    else:
        meta.window_biases = (meta.window_biases or {}) | {window: bias}
    return bias


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention in transformers' eager order (scale, cap, mask, sinks, float32 softmax) for
    what SDPA cannot express; q [1, H, q, D], k and v [1, H_kv, ctx, D], ``mask`` boolean
    or None for plain causal."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril_()
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        probs = _with_sinks(scores, sinks.view(1, -1, 1, 1).to(scores.dtype)).to(q.dtype)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax over each row's scores and its head's sink logit (``sinks`` broadcast to the
    rows), the sink's share dropped: as gpt-oss computes it."""
    both = torch.cat([scores, sinks.expand(*scores.shape[:-1], 1)], dim=-1)
    both = both - both.max(dim=-1, keepdim=True).values
    return torch.softmax(both, dim=-1, dtype=both.dtype)[..., :-1]


def _rows(x: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """Tokens ``[start, start + length)`` of ``x`` [tokens, heads, head_dim], with a
    contiguous head_dim: torch's CPU flash attention takes nothing else and falls back to
    its unfused math path (two bmms, a masked softmax, several passes) otherwise, which a
    transposed linear product (``layers.linear``, up to 256 rows) hands over. Measured in a
    step with a 64-token chunk over a 512-token cached prefix: docs/performance/log.md, section 12."""
    rows = x[start : start + length]
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, ctx_len: int) -> torch.Tensor:
    """[H, ctx_len, D] keys (or values) of one sequence from its blocks."""
    blocks = cache[block_ids]  # [n, bs, H, D]
    return blocks.reshape(-1, *cache.shape[-2:])[:ctx_len].transpose(0, 1)
