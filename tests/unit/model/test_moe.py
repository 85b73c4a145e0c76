"""The MoE block against transformers' own modules on random hidden states: the experts
each router chooses and their weights, per token, and the block's output (routed experts,
shared experts, gpt-oss's clamped SwiGLU with biases), for every family's router."""

from __future__ import annotations

import pytest
import torch

from pdmesh.model.moe import Router, SparseMoE, grouped_experts, sort_by_expert
from pdmesh.model.moe_config import parse_moe

H, T = 32, 40


def _families():  # type: ignore[no-untyped-def]
    from transformers import (
        DeepseekV2Config,
        DeepseekV3Config,
        GptOssConfig,
        MixtralConfig,
        OlmoeConfig,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as d2
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.gpt_oss import modeling_gpt_oss as go
    from transformers.models.mixtral import modeling_mixtral as mx
    from transformers.models.olmoe import modeling_olmoe as ol
    from transformers.models.qwen2_moe import modeling_qwen2_moe as q2
    from transformers.models.qwen3_moe import modeling_qwen3_moe as q3

    common = {"hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    return {
        "qwen3_moe": (Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                     norm_topk_prob=True), q3.Qwen3MoeTopKRouter, q3.Qwen3MoeSparseMoeBlock),
        "qwen2_moe": (Qwen2MoeConfig(**common, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
                                     shared_expert_intermediate_size=24, norm_topk_prob=False),
                      q2.Qwen2MoeTopKRouter, q2.Qwen2MoeSparseMoeBlock),
        "mixtral": (MixtralConfig(**common, num_local_experts=8, num_experts_per_tok=2, intermediate_size=16),
                    mx.MixtralTopKRouter, mx.MixtralSparseMoeBlock),
        "olmoe": (OlmoeConfig(**common, num_experts=8, num_experts_per_tok=2, intermediate_size=16),
                  ol.OlmoeTopKRouter, ol.OlmoeSparseMoeBlock),
        "gpt_oss": (GptOssConfig(**common, num_local_experts=8, num_experts_per_tok=2, intermediate_size=16),
                    go.GptOssTopKRouter, go.GptOssMLP),
        "deepseek_v3": (DeepseekV3Config(**common, n_routed_experts=16, num_experts_per_tok=4,
                                         moe_intermediate_size=16, n_shared_experts=1, n_group=4, topk_group=2,
                                         routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1),
                        ds.DeepseekV3TopkRouter, ds.DeepseekV3MoE),
        "deepseek_v2": (DeepseekV2Config(**common, n_routed_experts=16, num_experts_per_tok=4,
                                         moe_intermediate_size=16, n_shared_experts=2, n_group=4, topk_group=2,
                                         topk_method="group_limited_greedy", routed_scaling_factor=1.5,
                                         first_k_dense_replace=1),
                        d2.DeepseekV2TopkRouter, d2.DeepseekV2Moe),
        "deepseek_v2_greedy": (DeepseekV2Config(**common, n_routed_experts=16, num_experts_per_tok=4,
                                                moe_intermediate_size=16, n_shared_experts=1, topk_method="greedy",
                                                first_k_dense_replace=1),
                               d2.DeepseekV2TopkRouter, d2.DeepseekV2Moe),
    }


FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "deepseek_v3", "deepseek_v2",
            "deepseek_v2_greedy")


def _moe_cfg(family: str, hf_cfg):  # type: ignore[no-untyped-def]
    cfg = parse_moe(family.removesuffix("_greedy"), hf_cfg.to_dict(), hf_cfg.num_hidden_layers)
    assert cfg is not None
    return cfg


def _seeded(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in [*module.parameters(), *module.buffers()]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module.eval()


def _load_router(ours: Router, theirs: torch.nn.Module) -> None:
    with torch.no_grad():
        ours.gate.weight.copy_(theirs.weight)
        if ours.gate.bias is not None:
            ours.gate.bias.copy_(theirs.bias)
        if hasattr(theirs, "e_score_correction_bias"):
            ours.e_score_correction_bias.copy_(theirs.e_score_correction_bias)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_token_gets_transformers_experts_and_weights(family: str) -> None:
    hf_cfg, router_cls, _ = _families()[family]
    theirs = _seeded(router_cls(hf_cfg), 1)
    ours = Router(H, _moe_cfg(family, hf_cfg)).eval()
    _load_router(ours, theirs)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, want_w, want_ids = theirs(x)
        got_ids, got_w = ours(x)
    for t in range(T):  # DeepSeek's top-k is unsorted: compare each token's (expert -> weight)
        want = dict(zip(want_ids[t].tolist(), want_w[t].tolist()))
        got = dict(zip(got_ids[t].tolist(), got_w[t].tolist()))
        assert got.keys() == want.keys(), (family, t)
        assert all(abs(got[e] - want[e]) <= 1e-6 for e in want), (family, t)


def _load_block(ours: SparseMoE, theirs: torch.nn.Module, family: str) -> None:
    """transformers' weights into pdmesh's layout (gpt-oss: [E, H, 2I] with gate and up
    interleaved, transposed; the others: [E, 2I, H] gate then up, as pdmesh keeps them)."""
    experts = theirs.experts
    router = theirs.router if family == "gpt_oss" else theirs.gate
    _load_router(ours.router, router)
    with torch.no_grad():
        if family == "gpt_oss":
            gu = experts.gate_up_proj
            ours.experts.gate_up.copy_(torch.cat([gu[..., ::2], gu[..., 1::2]], dim=-1).transpose(1, 2))
            b = experts.gate_up_proj_bias
            ours.experts.gate_up_bias.copy_(torch.cat([b[..., ::2], b[..., 1::2]], dim=-1))
            ours.experts.down.copy_(experts.down_proj.transpose(1, 2))
            ours.experts.down_bias.copy_(experts.down_proj_bias)
        else:
            ours.experts.gate_up.copy_(experts.gate_up_proj)
            ours.experts.down.copy_(experts.down_proj)
        shared = getattr(theirs, "shared_expert", None) or getattr(theirs, "shared_experts", None)
        if shared is not None:
            for name in ("gate", "up", "down"):
                getattr(ours.shared, name).weight.copy_(getattr(shared, f"{name}_proj").weight)
        if getattr(theirs, "shared_expert_gate", None) is not None:
            ours.shared_gate.weight.copy_(theirs.shared_expert_gate.weight)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_block_computes_what_transformers_computes(family: str) -> None:
    hf_cfg, _, block_cls = _families()[family]
    theirs = _seeded(block_cls(hf_cfg), 3)
    ours = SparseMoE(H, _moe_cfg(family, hf_cfg)).eval()
    _load_block(ours, theirs, family)
    x = torch.randn(1, T, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = theirs(x)
        want = want[0] if isinstance(want, tuple) else want
        got = ours(x[0])
    torch.testing.assert_close(got, want[0], rtol=1e-5, atol=1e-5)


def test_pairs_are_grouped_by_expert_then_rank_then_token() -> None:
    ids = torch.tensor([[2, 0], [0, 2], [1, 2]])
    order, offsets = sort_by_expert(ids, 4)
    assert offsets.tolist() == [0, 2, 3, 6, 6]
    # expert 0: token 1 (rank 0), token 0 (rank 1); expert 1: token 2; expert 2: token 0 (rank 0),
    # then rank 1 of tokens 1 and 2 -- the order transformers visits them in.
    assert order.tolist() == [1 * 2 + 0, 0 * 2 + 1, 2 * 2 + 0, 0 * 2 + 0, 1 * 2 + 1, 2 * 2 + 1]


def test_experts_no_token_chose_cost_nothing_and_give_nothing() -> None:
    hf_cfg, _, _ = _families()["qwen3_moe"]
    block = _seeded(SparseMoE(H, _moe_cfg("qwen3_moe", hf_cfg)), 5)
    x = torch.randn(3, H)
    ids = torch.tensor([[1, 4], [4, 1], [1, 4]])
    out = grouped_experts(x, ids, torch.full((3, 2), 0.5), block.experts)
    with torch.no_grad():
        block.experts.gate_up[[0, 2, 3, 5, 6, 7]] = float("nan")  # never read
    assert torch.equal(grouped_experts(x, ids, torch.full((3, 2), 0.5), block.experts), out)


def _kernels():  # type: ignore[no-untyped-def]
    from pdmesh.attention.cpu_kernels import KernelsUnavailableError, load

    try:
        kernels = load()
    except KernelsUnavailableError as exc:
        pytest.skip(f"the CPU kernels are not built here: {exc}")
    if not hasattr(kernels, "moe_rows"):
        pytest.skip("moe_rows is built only where the CPU has AVX2 and FMA")
    return kernels


@pytest.mark.parametrize("tokens", [1, 3, 16, 40])
def test_the_cpu_kernel_computes_what_the_grouped_products_compute(tokens: int) -> None:
    """Every token's output, experts that no token chose included (they must cost and give
    nothing), within float32 rounding of the reference path."""
    kernels = _kernels()
    hf_cfg, _, _ = _families()["qwen3_moe"]
    block = _seeded(SparseMoE(H, _moe_cfg("qwen3_moe", hf_cfg)), 6)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ids, weights = block.router(x)
        want = grouped_experts(x, ids, weights, block.experts)
        block.experts.kernels = kernels
        got = block.experts(x, ids, weights)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # summation order alone
