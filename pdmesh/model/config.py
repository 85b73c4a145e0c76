"""Parse a Hugging Face ``config.json`` into the one decoder shape pdmesh runs.

Every family served is the same pre-norm decoder with a few switches: qkv / output biases,
q/k RMSNorm (per head, or over the whole projection), clipped q/k/v, RoPE scaling
(llama3, linear, LongRoPE), and a feed-forward that is a gated MLP or a mixture of experts
(``moe_config.py``). Each family's own field names are read here, in one place. Anything
that would change the math and that we do not implement raises ``UnsupportedModelError``
naming the field, rather than serving silently different tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdmesh.errors import InvalidRequestError, UnsupportedModelError
from pdmesh.model.moe_config import MoEConfig, parse_moe

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
}
"""The ``architectures`` pdmesh serves, by family (the README's table of families)."""
_ROPE_TYPES = ("default", "llama3", "linear", "longrope")
_QWEN2 = ("qwen2", "qwen2_moe")
_O_BIAS = ("llama", "mistral", "qwen3", "qwen3_moe", "olmoe")
"""Families whose ``attention_bias`` also puts a bias on the output projection."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    """longrope: per-frequency divisors below original_max_position_embeddings ..."""
    long_factor: tuple[float, ...] = ()
    """... and from it on."""
    attention_factor: float = 1.0
    """longrope: cos and sin are scaled by this."""


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
    sliding_window: int | None
    """Set when the model uses sliding-window attention (served only within the window)."""
    moe: MoEConfig | None = None
    """The mixture of experts of the sparse layers (None: a dense model)."""
    qk_norm_whole: bool = False
    clip_qkv: float | None = None
    """q, k and v are clamped to [-clip_qkv, clip_qkv] after their projection (OLMoE)."""

    def end_ids(self, tokenizer_eos: int | None) -> tuple[int, ...]:
        """The tokens that end a sequence: the config's EOS ids, else the tokenizer's."""
        return self.eos_token_ids or ((tokenizer_eos,) if tokenizer_eos is not None else ())

    def context_limit(self, requested: int | None) -> int:
        """The context to serve: ``requested`` (None or 0: the model's own), capped at the
        model's positions. pdmesh attends over the whole context, so a sliding-window model
        is exact only up to its window; beyond that it refuses rather than differ."""
        limit = min(requested or self.max_position_embeddings, self.max_position_embeddings)
        if self.sliding_window is not None and limit > self.sliding_window:
            raise InvalidRequestError(
                "max_model_len",
                f"the model uses sliding_window={self.sliding_window}; pdmesh serves it exactly only "
                f"with max_model_len <= {self.sliding_window} (got {limit})",
            )
        return limit

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
        return cls(
            architecture=arch,
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=layers,
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope(raw),
            qkv_bias=bool(raw.get("qkv_bias", True)) if family in _QWEN2 else biased,
            o_bias=family in _O_BIAS and biased,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_moe", "olmoe"),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            sliding_window=_sliding_window(raw, family),
            moe=parse_moe(family, raw, layers),
            qk_norm_whole=family == "olmoe",
            clip_qkv=float(raw["clip_qkv"]) if family == "olmoe" and raw.get("clip_qkv") else None,
        )


def _rope(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes "rope_parameters" (theta inside); older configs write
    # "rope_theta" plus an optional "rope_scaling" dict.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in _ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_type={rope_type!r} is not supported; pdmesh implements {list(_ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1.0 is not supported")
    original = int(params.get("original_max_position_embeddings",
                              raw.get("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))))
    if rope_type == "longrope":
        return _longrope(params, theta, original, int(raw.get("max_position_embeddings", original)))
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
    )


def _longrope(params: dict[str, Any], theta: float, original: int, max_positions: int) -> RopeConfig:
    """LongRoPE (Phi-3): as transformers computes it, the attention factor from the ratio
    of the context to the pre-training one when the config gives neither."""
    import math

    factor = params.get("factor") or max_positions / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeConfig(theta=theta, rope_type="longrope", factor=float(factor),
                      original_max_position_embeddings=original,
                      short_factor=tuple(float(f) for f in params["short_factor"]),
                      long_factor=tuple(float(f) for f in params["long_factor"]), attention_factor=float(attention))


def _sliding_window(raw: dict[str, Any], family: str) -> int | None:
    window = raw.get("sliding_window")
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not raw.get("use_sliding_window", False):
        return None
    return int(window) if window else None


def _reject_unsupported(raw: dict[str, Any]) -> None:
    if raw.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act={raw['hidden_act']!r} is not supported (only 'silu')")
    quant = raw.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise UnsupportedModelError(f"quantization_config (quant_method={method!r}) is not implemented: pdmesh "
                                    "serves unquantized weights (float32, bfloat16, float16); use the checkpoint "
                                    "they were quantized from")
    layer_types = raw.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise UnsupportedModelError(
            f"layer_types={sorted(set(layer_types))!r}: only 'full_attention' layers are supported"
        )
