"""Gemma 2's and Gemma 3's switches on the shared decoder, read from their configs
(torch-free): RMSNorm by ``1 + weight``, a norm on each sublayer's output as well as its
input, embeddings scaled by sqrt(hidden), GELU (tanh) in the MLP, scores scaled by
``query_pre_attn_scalar``, soft-capped logits (Gemma 2), and Gemma 3's second rotary table
for its sliding layers (``rope_local_base_freq``). Which layers slide, and Gemma 2's
soft-capped scores, are ``attention_config.py``'s.
"""

from __future__ import annotations

from typing import Any

from pdmesh.errors import UnsupportedModelError
from pdmesh.model.rope_config import rope_config, rope_params

GEMMA_FAMILIES = ("gemma2", "gemma3")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""transformers' activation names -> pdmesh's (``gelu_tanh``: torch's ``gelu(approximate="tanh")``,
which transformers' ``gelu_pytorch_tanh`` calls)."""
_LOCAL_THETA = 10000.0
_GLOBAL_THETA = {"gemma2": 10000.0, "gemma3": 1_000_000.0}
"""transformers' default base frequencies where a config leaves them out."""


def gemma_fields(raw: dict[str, Any], family: str, hidden: int) -> dict[str, Any]:
    """``ModelConfig`` fields of a Gemma 2/3 config (``rope`` included: Gemma 3 names its
    two tables by layer type)."""
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"hidden_activation={act!r} is not supported; pdmesh implements "
                                    f"{sorted(ACTIVATIONS)}")
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention (an embedding model, not a decoder) is not supported")
    final = raw.get("final_logit_softcapping")
    params = rope_params(raw)
    by_type = isinstance(params.get("full_attention"), dict) or isinstance(params.get("sliding_attention"), dict)
    glob = dict(params.get("full_attention") or {}) if by_type else params
    local = dict(params.get("sliding_attention") or {}) if by_type else {}
    local.setdefault("rope_theta", raw.get("rope_local_base_freq", _LOCAL_THETA))
    return {
        "activation": ACTIVATIONS[act],
        "attention_scale": float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        "norm_offset": 1.0,
        "sandwich_norms": True,
        "embed_scale": hidden**0.5,
        "final_softcap": float(final) if final else None,
        "rope": rope_config(glob, raw, _GLOBAL_THETA[family]),
        "local_rope": rope_config(local, {}) if family == "gemma3" else None,
    }
