"""The decoder every served family shares (``model/config.py``: Llama 2/3, Mistral,
Qwen2/3, Phi-3, Gemma 2/3, and the mixture-of-experts Qwen2/3-MoE, Mixtral, OLMoE,
gpt-oss and DeepSeek-V3, whose latent attention is ``model/mla.py``) over a
paged KV cache; a family is its config's switches plus its checkpoint names
(``model/weights.py``). Each layer attends as its ``LayerAttention`` says (full or a
sliding window, soft-capped scores), the backend applying it.

Inputs are flattened across the batch ([T] token ids and positions); the attention backend
writes each layer's K/V into the paged pool and attends over every sequence's context.
Only the rows that sample (``logits_indices``) go through the LM head, and, given a
``SampledRows``, through the last layer past its KV write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import cast

import torch
from torch import nn

from pdmesh.attention.backend import AttentionBackend, AttentionMetadata
from pdmesh.attention.sampled_rows import SampledRows
from pdmesh.errors import UnsupportedModelError
from pdmesh.model import linear_plan, onednn
from pdmesh.model.config import ModelConfig
from pdmesh.model.layers import (
    DEFAULT_PLAN,
    FewRows,
    GatedMLP,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    apply_rope_,
    few_rows_kernel,
    linear,
    transposed_mm,
)
from pdmesh.model.mla import MLAAttention
from pdmesh.model.moe import Experts, SparseMoE
from pdmesh.model.weights import IndexKey, index_key, missing_parts, weight_writes


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.kind = cfg.layer_attention[index]
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.scale
        self.qkv = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.whole_norm = cfg.qk_norm_whole
        q_dim, k_dim = (self.q_size, self.kv_size) if cfg.qk_norm_whole else (cfg.head_dim, cfg.head_dim)
        self.q_norm = RMSNorm(q_dim, cfg.rms_norm_eps, cfg.norm_offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_dim, cfg.rms_norm_eps, cfg.norm_offset) if cfg.qk_norm else None
        self.clip = cfg.clip_qkv
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None
        """Each head's sink logit (gpt-oss)."""
        self.kernels: ModuleType | None = None
        """The CPU kernels when the engine runs them (``LlamaForCausalLM.use_kernels``)."""

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
        """The attention output of every row, or of ``last.rows`` alone (every row's K/V
        written all the same)."""
        t = x.shape[0]
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.whole_norm and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # over each whole projection (OLMoE)
        if self.clip is not None:
            q, k, v = (p.clamp(-self.clip, self.clip) for p in (q, k, v))
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if not self.whole_norm and self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rope_(self.kernels, q, cos, sin)
        k = apply_rope_(self.kernels, k, cos, sin)
        backend.write_kv(kv_layer, k, v, meta)
        if last is not None:
            q, k, v, meta = q[last.rows], k[last.rows], v[last.rows], last.meta
            t = q.shape[0]
        out = backend.attend(q, k, v, kv_layer, meta, self.scale, self.kind.window, self.kind.softcap, self.sinks)
        return self.o(out.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        hidden, eps, offset = cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset
        self.input_norm = RMSNorm(hidden, eps, offset)
        self.attn: Attention | MLAAttention = (
            MLAAttention(cfg, index) if cfg.mla is not None else Attention(cfg, index))
        self.post_attn_norm = RMSNorm(hidden, eps, offset)
        """The MLP's input norm."""
        self.attn_out_norm = RMSNorm(hidden, eps, offset) if cfg.sandwich_norms else None
        self.mlp_out_norm = RMSNorm(hidden, eps, offset) if cfg.sandwich_norms else None
        self.mlp: GatedMLP | SparseMoE = (
            SparseMoE(cfg.hidden_size, cfg.moe) if cfg.moe is not None and cfg.moe.is_sparse(index)
            else GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.activation))

    def forward(self, h, cos, sin, kv_layer, meta, backend, last=None):
        """The next hidden states of every row, or of ``last.rows`` alone."""
        a = self.attn(self.input_norm(h), cos, sin, kv_layer, meta, backend, last)
        if self.attn_out_norm is not None:
            a = self.attn_out_norm(a)
        h = (h if last is None else h[last.rows]) + a
        m = self.mlp(self.post_attn_norm(h))
        return h + (m if self.mlp_out_norm is None else self.mlp_out_norm(m))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, max_positions)
        self.local_rotary = RotaryEmbedding(cfg.local_rope, cfg.head_dim, max_positions) if cfg.local_rope else None
        """The table of the layers marked ``local_rope`` (Gemma 3's sliding ones)."""
        self.lm_head = (
            None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.few_rows: FewRows | None = None
        """The CPU kernels' few-row product for the LM head (``use_kernels``)."""
        self.plan: linear_plan.LinearPlan = DEFAULT_PLAN
        """The product for each row count of every linear layer (``use_linear_plan``)."""
        self.head_packed: torch.Tensor | None = None
        """oneDNN's copy of the LM head's weight, where the plan runs oneDNN."""

    def use_kernels(self, kernels: ModuleType | None) -> None:
        """Run norms, rotary embedding, SiLU x up and few-row linear products with pdmesh's
        CPU kernels (the module ``pdmesh.attention.cpu_kernels.load`` returns), or with torch
        ops (None)."""
        self.few_rows = few_rows_kernel(kernels)
        for m in self.modules():
            if isinstance(m, (RMSNorm, Attention, MLAAttention, GatedMLP, Experts)):
                m.kernels = kernels
            elif isinstance(m, Linear):
                m.few_rows = self.few_rows

    def use_linear_plan(self, always_onednn: bool = False) -> linear_plan.LinearPlan:
        """Time the linear products on this model's weights (call after ``use_kernels``)
        and compute every row count with the fastest (``pdmesh.model.linear_plan``), or
        with oneDNN's everywhere when ``always_onednn``. Where oneDNN runs for every row
        count the original weights are never read again and are freed (the embedding's,
        which a tied LM head shares, stays); otherwise both copies stay."""
        plan = self.choose_linear_plan(always_onednn)
        self.apply_linear_plan(plan)
        if plan.onednn_only:
            linears = [*self._body_linears(), *([self.lm_head] if self.lm_head is not None else [])]
            for m in linears:
                m.weight = nn.Parameter(torch.empty(0, dtype=m.weight.dtype), requires_grad=False)
        return plan

    def apply_linear_plan(self, plan: linear_plan.LinearPlan) -> None:
        """Compute every linear layer by ``plan``; where it runs oneDNN, the weights are
        packed in its layout (once)."""
        if plan.packs and self.head_packed is None:
            mlps = [m for m in self.modules() if isinstance(m, GatedMLP)]
            fused = {id(m) for mlp in mlps for m in (mlp.gate, mlp.up)}
            for m in self._body_linears():
                if id(m) not in fused:
                    m.packed = onednn.pack(m.weight)
            for mlp in mlps:
                mlp.fuse_packed()
            self.head_packed = onednn.pack(self._head_weight())
        self.plan = plan
        for m in self._body_linears():
            m.plan = plan

    def choose_linear_plan(self, always_onednn: bool = False, share: bool = True) -> linear_plan.LinearPlan:
        """``use_linear_plan``'s measurement alone: the plan for this model's weights,
        nothing packed; with ``share``, one that another process of this machine measured
        on the same shapes and threads in the last minutes (``pdmesh.model.plan_store``).
        ``scripts/probes/linear/linear_plan_probe.py`` repeats it unshared to see whether a machine's
        choice is stable."""
        weights = [m.weight for m in self._body_linears()] + [self._head_weight()]
        products: dict[linear_plan.Product, linear_plan.ProductFn] = {
            linear_plan.Product.MM: transposed_mm,
            linear_plan.Product.LINEAR: nn.functional.linear,
        }
        if self.few_rows is not None:
            products[linear_plan.Product.KERNEL] = self.few_rows
        return linear_plan.choose(weights, products, always_onednn, share)

    def _body_linears(self) -> list[Linear]:
        return [m for m in self.modules() if isinstance(m, Linear) and m is not self.lm_head]

    def _head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
        logits_indices: torch.Tensor,
        last: SampledRows | None = None,
    ) -> torch.Tensor:
        """Float32 logits [len(logits_indices), vocab] for the sampling rows; with ``last``
        (the same rows' share of the step), the last layer computes only its rows."""
        h = self.embed(input_ids)
        if self.cfg.embed_scale is not None:
            h = h * torch.tensor(self.cfg.embed_scale, dtype=h.dtype)  # rounded to the dtype, as Gemma's
        tables = self.rotary(positions, h.dtype)
        local = self.local_rotary(positions, h.dtype) if self.local_rotary is not None else tables
        final = len(self.layers) - 1
        for i, layer in enumerate(cast(Sequence[DecoderLayer], self.layers)):
            cos, sin = local if layer.attn.kind.local_rope else tables
            h = layer(h, cos, sin, kv_cache[:, i], meta, backend, last if i == final else None)
        h = self.norm(h[logits_indices if last is None else last.logits_indices])
        logits = linear(h, self._head_weight(), None, self.few_rows, self.head_packed, self.plan)
        if (cap := self.cfg.final_softcap) is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def build_rotary(self, max_positions: int) -> None:
        """(Re)build the rotary tables in float32, as transformers keeps them (each use casts
        them): after ``.to(dtype)``, which would round them."""
        self.rotary = RotaryEmbedding(self.cfg.rope, self.cfg.head_dim, max_positions)
        if self.cfg.local_rope is not None:
            self.local_rotary = RotaryEmbedding(self.cfg.local_rope, self.cfg.head_dim, max_positions)

    # -- weights ----------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint tensors by the family's names (``model/weights.py``); every
        element of every parameter must be written, each tensor in its expected shape."""
        params: dict[str, torch.Tensor] = dict(self.named_parameters())
        params.update((n, b) for n, b in self.named_buffers() if n.endswith("e_score_correction_bias"))
        written = dict.fromkeys(params, 0)
        parts: dict[str, set[IndexKey]] = {}
        for name, tensor in weights:
            writes = weight_writes(name, self.cfg)
            for w in writes or ():
                if w.param == "lm_head.weight" and self.lm_head is None:
                    continue
                if w.param not in params:
                    raise UnsupportedModelError(f"weight {name!r} has no place in the {self.cfg.family} model")
                dest = params[w.param][w.dest] if w.dest else params[w.param]
                part = tensor[w.src] if w.src else tensor
                _copy(dest, w.fn(part) if w.fn is not None else part, name)
                written[w.param] += dest.numel()
                parts.setdefault(w.param, set()).add(index_key(w.dest))
        missing = sorted(n for n, p in params.items() if written[n] < p.numel())
        if missing:
            named = [missing_parts(n, parts.get(n, set()), self.cfg) for n in missing]
            raise UnsupportedModelError(f"weights missing from the checkpoint: {', '.join(named)}")
        if self.cfg.norm_offset:  # Gemma's norms scale by 1 + weight: fold the 1 in once
            with torch.no_grad():
                for m in self.modules():
                    if isinstance(m, RMSNorm):
                        m.weight.add_(m.offset)


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise UnsupportedModelError(
            f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
