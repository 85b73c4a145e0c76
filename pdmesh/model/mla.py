"""Multi-head latent attention (DeepSeek-V2/V3) over the paged cache, which holds each token's
latent (``mla_config.py``) in place of K and V.

Each layer writes its tokens' latents, ``[normed kv compression | rotated shared key]``,
into the block slots the scheduler gave them, then expands the latents of every context it
attends (``kv_b_proj``) into per-head keys and values and attends as transformers does:
SDPA over a prefill chunk, the same two matmuls as the torch backend's for decode tokens.
That is the reference formulation, token for token transformers' in float32, and what the
torch backend runs.

Where the engine runs the CPU kernels, decode tokens attend on the latent instead, the
up-projections absorbed as DeepSeek's own inference does: each head's query meets
``kv_b``'s key half once (``q_nope @ W_uk`` gives a query in the latent's space), every
head then scores the same latent rows, which is multi-query attention with one KV head of
``kv_lora_rank + rope`` numbers (the C++ decode kernel, each latent row read once for all
heads), and the weighted sum of compressions meets the value half once per head. No
context is expanded; per token and step that is heads x (latent_dim) multiply-adds for the
scores instead of kv_b's heads x (nope + v) x kv_lora_rank. The sums run in another order
than transformers', so greedy tokens equal its only up to near-ties (tests compare tie-aware).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from pdmesh.attention.backend import AttentionBackend, AttentionMetadata
from pdmesh.attention.sampled_rows import SampledRows
from pdmesh.attention.torch_backend import decode_bias
from pdmesh.model.config import ModelConfig
from pdmesh.model.layers import Linear, RMSNorm, apply_rope

if TYPE_CHECKING:
    from types import ModuleType

LORA_NORM_EPS = 1e-6
"""The eps of the q and kv compressions' norms: transformers keeps its default there, not
the config's ``rms_norm_eps``."""


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        mla = cfg.mla
        if mla is None:
            raise ValueError("MLAAttention needs a config with multi-head latent attention")
        self.mla = mla
        self.kind = cfg.layer_attention[index]
        self.num_heads = cfg.num_heads
        self.scale = cfg.scale
        q_out = cfg.num_heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.q_proj: Linear | None = Linear(cfg.hidden_size, q_out, bias=False)
        else:
            self.q_proj = None
            self.q_a_proj = Linear(cfg.hidden_size, mla.q_lora_rank, bias=cfg.qkv_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LORA_NORM_EPS)
            self.q_b_proj = Linear(mla.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, mla.latent_dim, bias=cfg.qkv_bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LORA_NORM_EPS)
        self.kv_b_proj = Linear(mla.kv_lora_rank, cfg.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.o = Linear(cfg.num_heads * mla.v_head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.kernels: ModuleType | None = None
        """The CPU kernels when the engine runs them (``LlamaForCausalLM.use_kernels``):
        decode then attends on the latent (``_decode_absorbed``)."""

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
        last: SampledRows | None = None,
    ) -> torch.Tensor:
        """The attention output of every row, or of ``last.rows`` alone (every row's latent
        written all the same). ``kv_layer`` is [blocks, 1, block_size, 1, latent_dim]."""
        mla, t = self.mla, x.shape[0]
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(t, self.num_heads, mla.qk_head_dim)
        q_pass, q_rot = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        compressed, k_rot = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        q_rot, k_rot = (self._rope(r, cos, sin) for r in (q_rot, k_rot.unsqueeze(1)))
        latent = torch.cat([self.kv_a_layernorm(compressed), k_rot.squeeze(1)], dim=-1)
        cache = kv_layer[:, 0, :, 0]  # [blocks, block_size, latent_dim]
        cache[meta.slot_blocks, meta.slot_offsets] = latent.to(cache.dtype)
        query = torch.cat([q_pass, q_rot], dim=-1)
        if last is not None:
            query, latent, meta = query[last.rows], latent[last.rows], last.meta
        out = torch.empty((query.shape[0], self.num_heads, mla.v_head_dim), dtype=x.dtype, device=x.device)
        nd = meta.num_decodes
        if nd and self.kernels is not None:
            q_nope, q_rot = query[:nd].split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
            out[:nd] = self._decode_absorbed(q_nope, q_rot, kv_layer, meta)
        elif nd:
            out[:nd] = self._decode(query[:nd], cache, meta)
        for p in meta.prefills:
            qs = query[p.q_start : p.q_start + p.q_len].transpose(0, 1).unsqueeze(0)
            own = p.ctx_len == p.q_len  # no cached prefix: the chunk's own latents
            rows = latent[p.q_start : p.q_start + p.q_len] if own else cache[p.block_ids].flatten(0, 1)[: p.ctx_len]
            k, v = (s.transpose(0, 1).unsqueeze(0) for s in self._expand(rows))
            mask = None if own else p.mask()
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale)
            out[p.q_start : p.q_start + p.q_len] = o.squeeze(0).transpose(0, 1)
        return self.o(out.reshape(out.shape[0], self.num_heads * mla.v_head_dim))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rotary embedding on ``x`` [T, heads, rope_dim] in the family's layout
        (``mla_config.RopeLayout``), as its transformers code computes it."""
        layout = self.mla.rope_layout
        if layout == "halves":
            return apply_rope(x, cos, sin)
        half = x.shape[-1] // 2
        cos, sin = cos[..., :half], sin[..., :half]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        if layout == "pairs":  # (x1 + i x2)(cos + i sin), each pair back in its place
            return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [N, heads, qk_head_dim] and values [N, heads, v_head_dim] of latents [N, latent_dim]."""
        mla = self.mla
        compressed, k_rot = latent.split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(compressed).view(latent.shape[0], self.num_heads, -1)
        k_nope, v = kv.split([mla.qk_nope_head_dim, mla.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_rot[:, None, :].expand(-1, self.num_heads, -1)], dim=-1)
        return k, v

    def _decode(self, q: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Each decode token over its whole context: the padded contexts expanded at once,
        positions past a token's length masked (the step's bias, shared with every layer)."""
        tables, lens = meta.decode_block_tables, meta.decode_seq_lens
        if tables is None or lens is None:
            raise RuntimeError("decode tokens scheduled without decode block tables")
        b, span = tables.shape[0], tables.shape[1] * cache.shape[1]
        k, v = self._expand(cache[tables].reshape(b * span, -1))
        k = k.view(b, span, self.num_heads, -1).transpose(1, 2)  # [b, heads, span, qk]
        v = v.view(b, span, self.num_heads, -1).transpose(1, 2)
        scores = torch.matmul(q.unsqueeze(2), k.transpose(-1, -2)).float().mul_(self.scale)  # [b, heads, 1, span]
        scores.add_(decode_bias(meta, lens, span))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.matmul(probs, v).squeeze(2)

    def _up_halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b``'s weight as its key half [heads, nope, kv_lora_rank] and value half
        [heads, v, kv_lora_rank]: views of the one weight, no copy."""
        mla = self.mla
        w = self.kv_b_proj.weight.view(self.num_heads, mla.qk_nope_head_dim + mla.v_head_dim, mla.kv_lora_rank)
        return w[:, : mla.qk_nope_head_dim], w[:, mla.qk_nope_head_dim :]

    def _decode_absorbed(self, q_nope: torch.Tensor, q_rot: torch.Tensor, kv_layer: torch.Tensor,
                         meta: AttentionMetadata) -> torch.Tensor:
        """Decode tokens ([b, heads, nope] and their rotated [b, heads, rope]) attending on
        the latent: the scores of ``[q_nope W_uk | q_rot]`` against ``[compression | k_rot]``
        are those of the expanded keys, and the weighted compressions times ``W_uv`` are the
        weighted values. The kernel reads K and V rows from one plane (V's stride 0), so each
        latent row is both; the k_rot part of its output is dropped."""
        if self.kernels is None or meta.decode_block_tables is None or meta.decode_seq_lens is None:
            raise RuntimeError("absorbed MLA decode runs on the CPU kernels, over decode block tables")
        w_uk, w_uv = self._up_halves()
        rank = self.mla.kv_lora_rank
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [b, heads, rank]
        q = torch.cat([q_lat, q_rot], dim=-1).contiguous()
        planes = kv_layer.as_strided((kv_layer.shape[0], 2, *kv_layer.shape[2:]),
                                     (kv_layer.stride(0), 0, *kv_layer.stride()[2:]))
        ctx = self.kernels.paged_decode(q, planes, meta.decode_block_tables, meta.decode_seq_lens,
                                        self.scale, 0, 0.0)[..., :rank]  # [b, heads, rank]
        return torch.bmm(ctx.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [b, heads, v]
