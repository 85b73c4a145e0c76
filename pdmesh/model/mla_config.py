"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) as a config says it (torch-free:
the kvstore and the router size KV blocks from it).

MLA caches one vector per token and layer instead of K and V per head: the normed
compression of the hidden state (``kv_lora_rank`` wide) beside one rotary key shared by
every head (``qk_rope_head_dim``). Each head's key and value are projected back up from
the latent when attention reads it (``pdmesh/model/mla.py``), so a block holds
``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer: DeepSeek-V3's 576 against
the 32,768 of K and V for its 128 heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")

RopeLayout = Literal["halves", "pairs_to_halves", "pairs"]
"""How the rotary dimensions are laid out and rotated, as each family's transformers code
does it: ``halves`` rotates (x[:d/2], x[d/2:]) in place (``rope_interleave: false``);
``pairs_to_halves`` rotates the pairs (x0, x1), (x2, x3) ... and writes them out as halves
(DeepSeek-V3); ``pairs`` rotates the pairs in place, as a complex product (DeepSeek-V2).
Queries and keys share the layout, so each gives the same scores up to rounding; the
family's own one gives transformers' bits."""


@dataclass(frozen=True)
class MLAConfig:
    q_lora_rank: int | None
    """Queries go through a normed low-rank bottleneck this wide (None: one projection)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    """Each head's key and query dimensions that take no rotary embedding."""
    qk_rope_head_dim: int
    """The rotary dimensions: one key for all heads, a query part per head."""
    v_head_dim: int
    rope_layout: RopeLayout

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """The numbers a token's KV holds per layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def parse_mla(family: str, raw: dict[str, Any]) -> MLAConfig:
    q_rank = raw.get("q_lora_rank")
    layout: RopeLayout = "pairs" if family == "deepseek_v2" else (
        "pairs_to_halves" if raw.get("rope_interleave", True) else "halves")
    return MLAConfig(
        q_lora_rank=int(q_rank) if q_rank else None,
        kv_lora_rank=int(raw["kv_lora_rank"]),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
        v_head_dim=int(raw["v_head_dim"]),
        rope_layout=layout,
    )


def mla_scale(mla: MLAConfig, rope: dict[str, Any]) -> float:
    """The score scale: ``qk_head_dim ** -0.5``, times YaRN's ``mscale_all_dim`` correction
    squared when the rotary embedding is scaled (as DeepSeek's reference computes it)."""
    scale = mla.qk_head_dim**-0.5
    m_all = rope.get("mscale_all_dim") if rope.get("rope_type", rope.get("type", "default")) != "default" else 0
    factor = float(rope.get("factor") or 1.0)
    if m_all and factor > 1:
        m = 0.1 * float(m_all) * math.log(factor) + 1.0
        scale = scale * m * m
    return scale
