"""The mixture-of-experts side of a model's config, parsed from each family's own field
names (torch-free: the router and the kvstore read model configs too).

A sparse layer's feed-forward is a router choosing ``top_k`` of ``num_experts`` gated MLPs
per token, optionally beside a shared expert every token goes through. The families differ
in which layers are sparse, how the router scores (``RouterKind``) and whether the chosen
weights are renormalised; everything else is the same block (``pdmesh/model/moe.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pdmesh.errors import UnsupportedModelError

RouterKind = Literal["softmax_topk", "topk_softmax", "sigmoid_group_topk", "softmax_group_topk"]
"""softmax_topk: softmax over every expert (float32), the top k, optionally renormalised
(Qwen2/3-MoE, Mixtral, OLMoE); topk_softmax: the top k logits of a biased router, softmax
over those alone (gpt-oss); sigmoid_group_topk: sigmoid scores, experts chosen by score
plus a correction bias within the best groups, weights from the scores, renormalised and
scaled (DeepSeek-V3); softmax_group_topk: softmax scores, the top k within the groups whose
best expert is among the ``topk_group`` best (all groups for ``topk_method: greedy``),
their scores scaled, never renormalised (DeepSeek-V2)."""


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    """Each routed expert's hidden width."""
    sparse_layers: frozenset[int]
    """Layers whose feed-forward is the MoE block; the others are a dense MLP."""
    norm_topk_prob: bool = False
    """Renormalise the chosen experts' weights to sum to one."""
    router: RouterKind = "softmax_topk"
    float32_weights: bool = False
    """softmax_topk: the chosen weights stay float32 (Mixtral) instead of taking the
    activations' dtype (Qwen, OLMoE); the other routers' weights keep their own dtype."""
    router_bias: bool = False
    """The router's linear layer has a bias (gpt-oss)."""
    shared_intermediate_size: int = 0
    """Width of the shared expert every token also goes through (0: none)."""
    shared_gate: bool = False
    """The shared expert's output is scaled by sigmoid(a learned gate) (Qwen2-MoE)."""
    n_group: int = 1
    """The grouped routers: experts are chosen within the ``topk_group`` best of these groups."""
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    """The grouped routers: the routed experts' weights are scaled by this."""
    activation: Literal["silu", "clamped_swiglu"] = "silu"
    """silu: down(silu(gate) * up); clamped_swiglu (gpt-oss): gate clamped above and up on
    both sides at ``swiglu_limit``, down((up + 1) * gate * sigmoid(alpha * gate))."""
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    expert_bias: bool = False
    """The experts' gate/up and down products have biases (gpt-oss)."""

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise UnsupportedModelError(f"num_experts_per_tok={self.top_k} must be 1..num_experts={self.num_experts}")
        if self.n_group < 1 or self.num_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise UnsupportedModelError(f"n_group={self.n_group}, topk_group={self.topk_group} do not divide "
                                        f"{self.num_experts} experts")


def _stepped(raw: dict[str, Any], layers: int) -> frozenset[int]:
    """Qwen's rule: layer i is sparse unless listed in ``mlp_only_layers``, every
    ``decoder_sparse_step``-th layer."""
    step = int(raw.get("decoder_sparse_step", 1) or 1)
    dense = set(raw.get("mlp_only_layers") or [])
    return frozenset(i for i in range(layers) if i not in dense and (i + 1) % step == 0)


def _experts(raw: dict[str, Any], *names: str) -> int:
    for name in names:
        if raw.get(name):
            return int(raw[name])
    raise UnsupportedModelError(f"the config names no expert count ({' or '.join(names)})")


def parse_moe(family: str, raw: dict[str, Any], layers: int) -> MoEConfig | None:
    """The MoE config of a family's raw config (None for dense families)."""
    if family in ("qwen2_moe", "qwen3_moe"):
        experts = _experts(raw, "num_experts", "num_local_experts")
        shared = int(raw.get("shared_expert_intermediate_size", 0) or 0) if family == "qwen2_moe" else 0
        return MoEConfig(experts, int(raw["num_experts_per_tok"]), int(raw["moe_intermediate_size"]),
                         _stepped(raw, layers), bool(raw.get("norm_topk_prob", False)),
                         shared_intermediate_size=shared, shared_gate=shared > 0)
    if family == "mixtral":
        return MoEConfig(_experts(raw, "num_local_experts", "num_experts"), int(raw["num_experts_per_tok"]),
                         int(raw["intermediate_size"]), frozenset(range(layers)), norm_topk_prob=True,
                         float32_weights=True)
    if family == "gpt_oss":
        return MoEConfig(_experts(raw, "num_local_experts", "num_experts"), int(raw["num_experts_per_tok"]),
                         int(raw["intermediate_size"]), frozenset(range(layers)), router="topk_softmax",
                         router_bias=True, activation="clamped_swiglu", expert_bias=True,
                         swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
                         swiglu_limit=float(raw.get("swiglu_limit", 7.0)))
    if family == "deepseek_v3":
        dense = int(raw.get("first_k_dense_replace", 0) or 0)
        width = int(raw["moe_intermediate_size"])
        return MoEConfig(_experts(raw, "n_routed_experts", "num_local_experts"), int(raw["num_experts_per_tok"]),
                         width, frozenset(range(dense, layers)), bool(raw.get("norm_topk_prob", True)),
                         router="sigmoid_group_topk",
                         shared_intermediate_size=width * int(raw.get("n_shared_experts") or 0),
                         n_group=int(raw.get("n_group") or 1), topk_group=int(raw.get("topk_group") or 1),
                         routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)))
    if family == "deepseek_v2":
        method = raw.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise UnsupportedModelError(f"topk_method={method!r} is not supported for DeepSeek-V2 "
                                        "(greedy, group_limited_greedy)")
        if int(raw.get("moe_layer_freq", 1) or 1) != 1:  # DeepSeek's own code reads it; transformers does not
            raise UnsupportedModelError(f"moe_layer_freq={raw['moe_layer_freq']} is not supported (only 1)")
        grouped = method == "group_limited_greedy"
        dense = int(raw.get("first_k_dense_replace", 0) or 0)
        width = int(raw["moe_intermediate_size"])
        return MoEConfig(_experts(raw, "n_routed_experts", "num_local_experts"), int(raw["num_experts_per_tok"]),
                         width, frozenset(range(dense, layers)), router="softmax_group_topk",
                         shared_intermediate_size=width * int(raw.get("n_shared_experts") or 0),
                         n_group=int(raw.get("n_group") or 1) if grouped else 1,
                         topk_group=int(raw.get("topk_group") or 1) if grouped else 1,
                         routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)))
    if family == "olmoe":
        return MoEConfig(_experts(raw, "num_experts", "num_local_experts"), int(raw["num_experts_per_tok"]),
                         int(raw["intermediate_size"]), frozenset(range(layers)),
                         bool(raw.get("norm_topk_prob", False)))
    return None
