"""The mixture-of-experts feed-forward: router -> top-k -> grouped expert products ->
weighted sum, behind one call (``SparseMoE``), the same for every family.

Experts are stored stacked, as one tensor per projection: ``gate_up`` [E, 2I, H] (each
expert's gate rows, then its up rows) and ``down`` [E, H, I]. A step's (token, choice)
pairs are sorted by expert once; each expert then computes all of its rows as one product
(``grouped_experts``, the reference path, or the CPU kernel ``moe_rows`` for the few rows
of a decode step), and every token's outputs are summed in ascending expert order, as
``transformers`` sums them.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from pdmesh.model.layers import GatedMLP, Linear
from pdmesh.model.moe_config import MoEConfig

KERNEL_MAX_ROWS = 256
"""Steps whose experts have at most this many rows each on average run through the CPU
kernel (float32, built with AVX2): on a 2-core Zen 4, Qwen3-30B-A3B's proportions (64
experts, 8 per token, 512 wide), the kernel took 1.7 ms at 16 tokens where one product per
expert took 8.6 ms (transformers 7.2), and 45 ms against 65 at 2,048 tokens, 256 rows per
expert (docs/moe.md). Beyond that, one product per expert, where MKL's large products pay
off."""


class Router(nn.Module):
    """Scores, chosen experts and their weights for every token, as the family's router
    computes them in ``transformers``."""

    e_score_correction_bias: torch.Tensor  # a registered buffer (DeepSeek's sigmoid router only)

    def __init__(self, hidden: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Linear(hidden, cfg.num_experts, bias=cfg.router_bias)
        if cfg.router == "sigmoid_group_topk":  # added to the scores for choosing, not weighting
            self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [T, k] int64, weights [T, k])``: the chosen experts and their weights."""
        cfg = self.cfg
        if cfg.router == "softmax_topk":
            probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
            weights, ids = torch.topk(probs, cfg.top_k, dim=-1)
            if cfg.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return ids, weights if cfg.float32_weights else weights.to(x.dtype)
        if cfg.router == "topk_softmax":
            top, ids = torch.topk(self.gate(x), cfg.top_k, dim=-1)
            return ids, torch.softmax(top, dim=1, dtype=top.dtype)
        if cfg.router == "softmax_group_topk":
            return self._grouped_softmax(x)
        return self._grouped_sigmoid(x)

    def _grouped_softmax(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V2's: a group counts by its best expert; the experts of the groups left
        out score 0 (not -inf, as transformers masks them), so with few groups kept they
        can still be chosen last."""
        cfg = self.cfg
        scores = nn.functional.linear(x.float(), self.gate.weight.float()).softmax(dim=-1, dtype=torch.float32)
        if cfg.n_group > 1:
            per_group = cfg.num_experts // cfg.n_group
            group_scores = scores.view(-1, cfg.n_group, per_group).max(dim=-1).values
            groups = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
            keep = torch.zeros_like(group_scores).scatter_(1, groups, 1).bool()
            keep = keep.unsqueeze(-1).expand(-1, cfg.n_group, per_group).reshape(-1, cfg.num_experts)
            scores = scores.masked_fill(~keep, 0.0)
        weights, ids = torch.topk(scores, k=cfg.top_k, dim=-1, sorted=False)
        return ids, weights * cfg.routed_scaling_factor

    def _grouped_sigmoid(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        scores = nn.functional.linear(x.float(), self.gate.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        per_group = cfg.num_experts // cfg.n_group
        group_scores = choice.view(-1, cfg.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        groups = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores).scatter_(1, groups, 1).bool()
        keep = keep.unsqueeze(-1).expand(-1, cfg.n_group, per_group).reshape(-1, cfg.num_experts)
        ids = torch.topk(choice.masked_fill(~keep, float("-inf")), k=cfg.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, weights * cfg.routed_scaling_factor


class Experts(nn.Module):
    """Every routed expert's weights, stacked (see the module's docstring)."""

    def __init__(self, hidden: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e, i = cfg.num_experts, cfg.intermediate_size
        self.gate_up = nn.Parameter(torch.empty(e, 2 * i, hidden), requires_grad=False)
        self.down = nn.Parameter(torch.empty(e, hidden, i), requires_grad=False)
        self.gate_up_bias = nn.Parameter(torch.empty(e, 2 * i), requires_grad=False) if cfg.expert_bias else None
        self.down_bias = nn.Parameter(torch.empty(e, hidden), requires_grad=False) if cfg.expert_bias else None
        self.kernels: ModuleType | None = None
        """The CPU kernels when the engine runs them (``moe_rows`` for short steps)."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        kernel = getattr(self.kernels, "moe_rows", None)
        if (kernel is not None and ids.numel() <= KERNEL_MAX_ROWS * self.cfg.num_experts and x.dtype == torch.float32
                and self.cfg.activation == "silu" and not self.cfg.expert_bias):
            order, offsets = sort_by_expert(ids, self.cfg.num_experts)
            return kernel(x.contiguous(), order, offsets, weights.float().reshape(-1), self.gate_up, self.down,
                          ids.shape[1])
        return grouped_experts(x, ids, weights, self)

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The expert's hidden activation from its [rows, 2I] gate/up product."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self.cfg.activation == "silu":
            return nn.functional.silu(gate) * up
        limit, alpha = self.cfg.swiglu_limit, self.cfg.swiglu_alpha
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def sort_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)``: the flat (token, choice) pair indices ``t * k + j`` grouped by
    expert (within an expert, by choice rank, then token, as ``transformers`` visits them),
    and where each expert's run starts ([E + 1])."""
    k = ids.shape[1]
    by_rank = ids.t().reshape(-1)  # rank-major, so a stable sort keeps rank, then token order
    order_in_rank = torch.argsort(by_rank, stable=True)
    tokens, ranks = order_in_rank % ids.shape[0], order_in_rank // ids.shape[0]
    counts = torch.bincount(by_rank, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    return tokens * k + ranks, offsets


def grouped_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: Experts) -> torch.Tensor:
    """The reference path: each expert's rows as one product, outputs summed per token in
    ascending expert order (``index_add_``)."""
    order, offsets = sort_by_expert(ids, experts.cfg.num_experts)
    k = ids.shape[1]
    flat_weights = weights.reshape(-1)
    out = torch.zeros_like(x)
    bounds = offsets.tolist()
    for e in range(experts.cfg.num_experts):
        start, end = bounds[e], bounds[e + 1]
        if start == end:
            continue
        pairs = order[start:end]
        tokens = pairs // k
        h = nn.functional.linear(x[tokens], experts.gate_up[e],
                                 experts.gate_up_bias[e] if experts.gate_up_bias is not None else None)
        y = nn.functional.linear(experts.activate(h), experts.down[e],
                                 experts.down_bias[e] if experts.down_bias is not None else None)
        out.index_add_(0, tokens, (y * flat_weights[pairs, None]).to(out.dtype))
    return out


class SparseMoE(nn.Module):
    """A sparse layer's feed-forward: the routed experts, plus the shared expert where the
    family has one (scaled by sigmoid of its gate in Qwen2-MoE)."""

    def __init__(self, hidden: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = Router(hidden, cfg)
        self.experts = Experts(hidden, cfg)
        self.shared = GatedMLP(hidden, cfg.shared_intermediate_size, False) if cfg.shared_intermediate_size else None
        self.shared_gate = Linear(hidden, 1, bias=False) if cfg.shared_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.router(x)
        out = self.experts(x, ids, weights)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out
