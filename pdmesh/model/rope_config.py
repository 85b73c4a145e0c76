"""The rotary embedding a config describes (torch-free: routers read configs too):
default, llama3, linear, LongRoPE or YaRN scaling; the tables are ``layers.RotaryEmbedding``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pdmesh.errors import UnsupportedModelError

ROPE_TYPES = ("default", "llama3", "linear", "longrope", "yarn")


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
    """longrope, yarn: cos and sin are scaled by this."""
    beta_fast: float = 32.0
    """yarn: frequencies that turn more than this often over the original context keep
    their own (extrapolated) ..."""
    beta_slow: float = 1.0
    """... those that turn fewer times than this are divided by ``factor`` (interpolated);
    a linear ramp between."""
    truncate: bool = True
    """yarn: the ramp's ends rounded to whole dimensions (gpt-oss sets False)."""



def rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    """The rotary parameters of a config: transformers >= 5 writes ``rope_parameters``
    (theta inside); older configs write ``rope_theta`` plus an optional ``rope_scaling``."""
    return dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})


def rope_config(params: dict[str, Any], raw: dict[str, Any], default_theta: float = 10000.0) -> RopeConfig:
    """The rotary embedding ``params`` describe (a ``rope_parameters`` dict), with the
    model's own fields (``raw``) where they leave one out."""
    theta = float(params.get("rope_theta", raw.get("rope_theta", default_theta)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_type={rope_type!r} is not supported; pdmesh implements {list(ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1.0 is not supported")
    original = int(params.get("original_max_position_embeddings",
                              raw.get("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))))
    if rope_type == "longrope":
        return _longrope(params, theta, original, int(raw.get("max_position_embeddings", original)))
    if rope_type == "yarn":
        return _yarn(params, theta, original, int(raw.get("max_position_embeddings", original)))
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
    factor = params.get("factor") or max_positions / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeConfig(theta=theta, rope_type="longrope", factor=float(factor),
                      original_max_position_embeddings=original,
                      short_factor=tuple(float(f) for f in params["short_factor"]),
                      long_factor=tuple(float(f) for f in params["long_factor"]), attention_factor=float(attention))


def _yarn(params: dict[str, Any], theta: float, original: int, max_positions: int) -> RopeConfig:
    """YaRN (gpt-oss, DeepSeek, Qwen long-context): as transformers computes it, the
    attention factor ``0.1 ln(factor) + 1`` (or the ratio of two such with ``mscale`` and
    ``mscale_all_dim``) when the config gives none."""
    factor = float(params.get("factor") or max_positions / original)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return RopeConfig(theta=theta, rope_type="yarn", factor=factor, original_max_position_embeddings=original,
                      attention_factor=float(attention), beta_fast=float(params.get("beta_fast") or 32),
                      beta_slow=float(params.get("beta_slow") or 1), truncate=bool(params.get("truncate", True)))
