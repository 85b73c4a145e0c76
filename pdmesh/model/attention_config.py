"""Each layer's attention as the model's config describes it: full or a sliding window,
scores soft-capped or not, and which rotary table it reads (torch-free: the router and the
kvstore read model configs too).

A sliding layer's query at position p attends the keys at positions p - W + 1 .. p, its own
included, as transformers masks it (``kv_idx > q_idx - sliding_window``). Families say which
layers slide in three ways, all read here: ``layer_types`` (transformers 5 writes it for
Gemma 2/3, gpt-oss and Qwen2/3), one ``sliding_window`` for every layer (Mistral, Mixtral, Phi-3),
and the older ``sliding_window_pattern`` of Gemma 3 configs on the Hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdmesh.errors import UnsupportedModelError

LAYER_TYPES = ("full_attention", "sliding_attention")
_EVERY_LAYER = ("mistral", "mixtral", "phi3")
"""Families whose ``sliding_window``, when set, applies to every layer (transformers reads
no ``layer_types`` for them)."""
_QWEN = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class LayerAttention:
    """One layer's attention."""

    window: int | None = None
    """A sliding window of this many positions (the query's own included); None: the whole context."""
    softcap: float | None = None
    """Scores pass through ``softcap * tanh(score / softcap)`` before the mask (Gemma 2)."""
    local_rope: bool = False
    """Rotated with the model's local table (Gemma 3's sliding layers: their own base frequency)."""


FULL = LayerAttention()


def layer_attention(raw: dict[str, Any], family: str, layers: int) -> tuple[LayerAttention, ...]:
    """Every layer's attention, read from the config as ``family`` names it."""
    window = raw.get("sliding_window")
    if family in _QWEN and not raw.get("use_sliding_window", False):
        window = None  # transformers' Qwen configs drop the window unless it is switched on
    window = int(window) if window else None
    softcap = raw.get("attn_logit_softcapping") if family.startswith("gemma") else None
    softcap = float(softcap) if softcap else None
    types = _layer_types(raw, family, layers, window)
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise UnsupportedModelError(f"layer_types {unknown!r} are not supported; pdmesh serves {list(LAYER_TYPES)}")
    if len(types) != layers:
        raise UnsupportedModelError(f"layer_types names {len(types)} layers, the model has {layers}")
    local = family == "gemma3"
    return tuple(
        LayerAttention(window=window, softcap=softcap, local_rope=local) if t == "sliding_attention" and window
        else LayerAttention(softcap=softcap)
        for t in types
    )


def _layer_types(raw: dict[str, Any], family: str, layers: int, window: int | None) -> list[str]:
    if family in _EVERY_LAYER:
        return ["sliding_attention" if window else "full_attention"] * layers
    if raw.get("layer_types"):
        return list(raw["layer_types"])
    if family in ("gemma2", "gpt_oss"):  # their even layers slide
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if family == "gemma3":  # five local layers, then one global
        pattern = int(raw.get("sliding_window_pattern", 6))
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if family in _QWEN and window:
        first = int(raw.get("max_window_layers", layers))
        return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    return ["full_attention"] * layers
