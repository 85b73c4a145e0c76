"""Parse a Hugging Face ``config.json`` into the one decoder shape pdmesh runs.

Every family served is the same pre-norm decoder with a few switches: qkv / output biases,
q/k RMSNorm (per head, or over the whole projection), clipped q/k/v, RoPE scaling
(llama3, linear, LongRoPE, YaRN), multi-head latent attention (``mla_config.py``), each
layer's attention (full or a sliding window, soft-capped;
``attention_config.py``), Gemma's norms, scaled embeddings and GELU (``gemma_config.py``),
and a feed-forward that is a gated MLP or a mixture of experts (``moe_config.py``).
Each family's own field names are read here, in one place. Anything
that would change the math and that we do not implement raises ``UnsupportedModelError``
naming the field, rather than serving silently different tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdmesh.errors import UnsupportedModelError
from pdmesh.model.attention_config import LayerAttention, layer_attention
from pdmesh.model.gemma_config import GEMMA_FAMILIES, gemma_fields
from pdmesh.model.mla_config import MLA_FAMILIES, MLAConfig, mla_scale, parse_mla
from pdmesh.model.moe_config import MoEConfig, parse_moe
from pdmesh.model.rope_config import RopeConfig, rope_config, rope_params

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
"""The ``architectures`` pdmesh serves, by family (the README's table of families)."""
_QWEN2 = ("qwen2", "qwen2_moe")
_O_BIAS = ("llama", "mistral", "qwen3", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v2", "deepseek_v3")
"""Families whose ``attention_bias`` also puts a bias on the output projection."""


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape, independent of which family wrote the config."""

    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    """RMSNorm on q and k: per head (Qwen3) or, with ``qk_norm_whole``, over each whole
    projection (OLMoE)."""
    tie_word_embeddings: bool
    torch_dtype: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    layer_attention: tuple[LayerAttention, ...]
    """Each layer's attention: full or a sliding window, soft-capped or not."""
    moe: MoEConfig | None = None
    """The mixture of experts of the sparse layers (None: a dense model)."""
    qk_norm_whole: bool = False
    clip_qkv: float | None = None
    """q, k and v are clamped to [-clip_qkv, clip_qkv] after their projection (OLMoE)."""
    activation: str = "silu"
    """The gated MLP's activation: ``silu`` or ``gelu_tanh`` (Gemma)."""
    attention_scale: float | None = None
    """Scores are q.k times this (Gemma: ``query_pre_attn_scalar ** -0.5``); None: head_dim ** -0.5."""
    norm_offset: float = 0.0
    """RMSNorm scales by ``offset + weight`` (Gemma stores its weights as 1 less)."""
    sandwich_norms: bool = False
    """The attention's and the MLP's outputs are normed too, before the residual adds (Gemma 2/3)."""
    embed_scale: float | None = None
    """Embeddings are multiplied by this, rounded to the model's dtype (Gemma: sqrt(hidden))."""
    final_softcap: float | None = None
    """Logits pass through ``cap * tanh(logit / cap)`` (Gemma 2)."""
    local_rope: RopeConfig | None = None
    """The rotary table of the layers marked ``local_rope`` (Gemma 3's sliding layers)."""
    attention_sinks: bool = False
    """Each head has a learned sink logit in its softmax, attended to by no value (gpt-oss)."""
    mla: MLAConfig | None = None
    """Multi-head latent attention (DeepSeek-V3): the KV cache holds a latent per token and
    layer; ``head_dim`` is then its rotary part, the width of the rotary tables."""

    @property
    def scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    @property
    def attention_variants(self) -> tuple[str, ...]:
        """What this model's layers add to full attention, in words (backends that compute
        only full attention refuse these)."""
        return tuple(name for name, used in (
            ("sliding windows", bool(self.windows)),
            ("soft-capped scores", any(a.softcap is not None for a in self.layer_attention)),
            ("attention sinks", self.attention_sinks),
            ("multi-head latent attention", self.mla is not None)) if used)

    @property
    def windows(self) -> frozenset[int]:
        """The sliding windows some layer uses (empty: every layer attends its whole context)."""
        return frozenset(a.window for a in self.layer_attention if a.window is not None)

    def end_ids(self, tokenizer_eos: int | None) -> tuple[int, ...]:
        """The tokens that end a sequence: the config's EOS ids, else the tokenizer's."""
        return self.eos_token_ids or ((tokenizer_eos,) if tokenizer_eos is not None else ())

    def context_limit(self, requested: int | None) -> int:
        """The context to serve: ``requested`` (None or 0: the model's own), capped at the
        model's positions."""
        return min(requested or self.max_position_embeddings, self.max_position_embeddings)

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise UnsupportedModelError(f"{path}: no config.json (is this a Hugging Face model folder?)")
        raw = json.loads(cfg_file.read_text())
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
        return cls.from_dict(raw, gen)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise UnsupportedModelError(
                f"architectures={archs!r} is not supported; pdmesh serves {', '.join(sorted(ARCHITECTURES))} "
                "(README.md, 'Model families')"
            )
        family = ARCHITECTURES[arch]
        _reject_unsupported(raw)
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        layers = int(raw["num_hidden_layers"])
        biased = bool(raw.get("attention_bias", False))
        eos = (generation or {}).get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        gemma = gemma_fields(raw, family, hidden) if family in GEMMA_FAMILIES else {}
        rope = gemma.pop("rope", None) or rope_config(rope_params(raw), raw)
        mla = parse_mla(family, raw) if family in MLA_FAMILIES else None
        if mla is not None:
            gemma["attention_scale"] = mla_scale(mla, rope_params(raw))
        return cls(
            architecture=arch,
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=layers,
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=mla.qk_rope_head_dim if mla else int(raw.get("head_dim") or hidden // num_heads),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=rope,
            qkv_bias=bool(raw.get("qkv_bias", True)) if family in _QWEN2 else biased,
            o_bias=family in _O_BIAS and biased,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_moe", "olmoe", "gemma3"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", family in GEMMA_FAMILIES)),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            layer_attention=layer_attention(raw, family, layers),
            moe=parse_moe(family, raw, layers),
            qk_norm_whole=family == "olmoe",
            clip_qkv=float(raw["clip_qkv"]) if family == "olmoe" and raw.get("clip_qkv") else None,
            attention_sinks=family == "gpt_oss",
            mla=mla,
            **gemma,
        )


def _reject_unsupported(raw: dict[str, Any]) -> None:
    if "hidden_activation" not in raw and raw.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act={raw['hidden_act']!r} is not supported (only 'silu')")
    quant = raw.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise UnsupportedModelError(f"quantization_config (quant_method={method!r}) is not implemented: pdmesh "
                                    "serves unquantized weights (float32, bfloat16, float16); use the checkpoint "
                                    "they were quantized from")
