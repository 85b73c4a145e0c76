"""The newer families ``make-tiny`` draws (Phi-3, Gemma 2/3, DeepSeek-V2/V3 and the mixtures of experts):
their config fields and checkpoint tensor names, as each family's own folders write them."""

from __future__ import annotations

from typing import Any

import torch

from pdmesh.tools import TINY_ARCHS

MOE_ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")
GEMMA_ARCHS = ("gemma2", "gemma3")
DEEPSEEK_ARCHS = ("deepseek_v2", "deepseek_v3")
TINY_WINDOW = 24
"""The Gemma archs' sliding window: short, so that tests' prompts run past it several times
over, and not a multiple of a block."""


def family_config(arch: str, hidden: int, heads: int, max_positions: int, layers: int, experts: int, top_k: int,
                  expert_intermediate: int) -> dict[str, Any]:
    """The newer families' fields, named as each family's config.json names them."""
    half = 2 * hidden // heads // 4  # rotary frequencies of a head (head_dim / 2)
    moe = {"num_experts_per_tok": top_k, "output_router_logits": False, "router_aux_loss_coef": 0.001}
    if arch == "phi3":
        # LongRoPE as Phi-3-mini-128k writes it; the tests stay below
        # original_max_position_embeddings, where transformers and pdmesh rotate alike.
        original = max_positions // 2
        return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "tie_word_embeddings": False,
                "rope_theta": 10000.0, "original_max_position_embeddings": original,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.02 * i for i in range(half)],
                                 "long_factor": [1.0 + 0.25 * i for i in range(half)],
                                 "original_max_position_embeddings": original},
                "sliding_window": None, "embd_pdrop": 0.0, "resid_pdrop": 0.0}
    if arch == "qwen2_moe":  # its first layer dense (mlp_only_layers), a shared expert on the others
        return {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "tie_word_embeddings": False,
                "rope_theta": 1000000.0, "num_experts": experts, "moe_intermediate_size": expert_intermediate,
                "shared_expert_intermediate_size": 4 * expert_intermediate, "norm_topk_prob": False,
                "decoder_sparse_step": 1, "mlp_only_layers": [0], "use_sliding_window": False,
                "sliding_window": None, "max_window_layers": layers, **moe}
    if arch == "qwen3_moe":
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "tie_word_embeddings": False,
                "rope_theta": 1000000.0, "head_dim": 2 * hidden // heads, "attention_bias": False,
                "num_experts": experts, "moe_intermediate_size": expert_intermediate,
                "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "use_sliding_window": False, "sliding_window": None, "max_window_layers": layers, **moe}
    if arch == "mixtral":  # intermediate_size is each expert's width
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "tie_word_embeddings": False,
                "rope_theta": 1000000.0, "num_local_experts": experts,
                "intermediate_size": expert_intermediate, "sliding_window": None,
                "router_jitter_noise": 0.0, **moe}
    if arch == "olmoe":  # q/k normed over the whole projection, q/k/v clipped
        return {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "tie_word_embeddings": False,
                "rope_theta": 10000.0, "num_experts": experts, "intermediate_size": expert_intermediate,
                "norm_topk_prob": False, "clip_qkv": 2.0, "attention_bias": False, **moe}
    if arch in GEMMA_ARCHS:
        return gemma_config(arch, hidden, heads, layers)
    if arch in DEEPSEEK_ARCHS:
        return deepseek_config(arch, hidden, heads, max_positions, experts, expert_intermediate) | moe
    raise ValueError(f"arch must be one of {', '.join(TINY_ARCHS)}, got {arch!r}")


def gemma_config(arch: str, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    """Gemma 2 (alternating local and global layers, soft-capped scores and logits) and
    Gemma 3 (five local layers per global one, or alternating in a 2-layer model; q/k
    norms; a local rotary table and linear scaling on the global one), as transformers 5
    saves them. The caps are lower than Gemma 2's (50 and 30) so that random weights reach
    them."""
    head_dim = 2 * hidden // heads
    every = 2 if arch == "gemma2" or layers < 6 else 6
    common = {"architectures": [f"{arch.capitalize()}ForCausalLM"], "tie_word_embeddings": True,
              "head_dim": head_dim, "query_pre_attn_scalar": head_dim, "sliding_window": TINY_WINDOW,
              "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh", "attention_bias": False,
              "layer_types": ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]}
    if arch == "gemma2":
        return common | {"model_type": "gemma2", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                         "attn_logit_softcapping": 4.0, "final_logit_softcapping": 8.0}
    return common | {"model_type": "gemma3_text", "attn_logit_softcapping": None, "final_logit_softcapping": None,
                     "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}


def deepseek_config(arch: str, hidden: int, heads: int, max_positions: int, experts: int,
                    expert_intermediate: int) -> dict[str, Any]:
    """DeepSeek-V3's shape in small: latent attention (a q compression half the hidden
    width, a kv latent of a quarter plus an 8-wide shared rotary key: 40 numbers a token
    and layer against the 128 of K and V for 4 heads of 16), YaRN with its mscale, a dense
    first layer, then grouped sigmoid routing with a shared expert. DeepSeek-V2's as its
    Lite model has it (queries through one projection, no compression) with the big one's
    group-limited softmax routing and in-place rotary pairs."""
    if arch == "deepseek_v2":
        family = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "q_lora_rank": None,
                  "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "n_shared_experts": 2,
                  "routed_scaling_factor": 1.5, "norm_topk_prob": False}
    else:
        family = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "q_lora_rank": hidden // 2,
                  "rope_interleave": True, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
                  "routed_scaling_factor": 2.5, "norm_topk_prob": True}
    return family | {
            "tie_word_embeddings": False, "num_key_value_heads": heads, "kv_lora_rank": hidden // 2,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "head_dim": 8,
            "n_routed_experts": experts, "moe_intermediate_size": expert_intermediate,
            "first_k_dense_replace": 1, "attention_bias": False,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": max_positions // 4, "mscale": 1.0,
                                "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}}


def _mla_weights(w: dict[str, torch.Tensor], p: str, cfg: dict[str, Any], normal, norm_weight) -> None:
    """One layer's latent-attention tensors, drawn wider than the rest (scale 0.1) so that
    scores, and so the rotary embedding and the latent's expansion, decide tokens."""
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv_rank = int(cfg["kv_lora_rank"])
    nope, rope, v = (int(cfg[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    a = p + "self_attn."
    if cfg["q_lora_rank"] is None:
        w[a + "q_proj.weight"] = normal(heads * (nope + rope), hidden, scale=0.1)
    else:
        q_rank = int(cfg["q_lora_rank"])
        w[a + "q_a_proj.weight"] = normal(q_rank, hidden, scale=0.1)
        w[a + "q_a_layernorm.weight"] = norm_weight(q_rank)
        w[a + "q_b_proj.weight"] = normal(heads * (nope + rope), q_rank, scale=0.1)
    w[a + "kv_a_proj_with_mqa.weight"] = normal(kv_rank + rope, hidden, scale=0.1)
    w[a + "kv_a_layernorm.weight"] = norm_weight(kv_rank)
    w[a + "kv_b_proj.weight"] = normal(heads * (nope + v), kv_rank, scale=0.1)
    w[a + "o_proj.weight"] = normal(hidden, heads * v)


def family_weights(w: dict[str, torch.Tensor], cfg: dict[str, Any], normal, norm_weight) -> None:
    """The newer families' tensors, under each family's checkpoint names, drawn in order."""
    arch, hidden = cfg["model_type"], int(cfg["hidden_size"])
    heads, kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter, layers = int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
                  or 0)
    width = int(cfg.get("moe_intermediate_size") or inter)
    gemma = arch in ("gemma2", "gemma3_text")
    if gemma:  # Gemma's norms scale by 1 + weight
        norm_weight = lambda n: normal(n, scale=0.1)  # noqa: E731
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(hidden)
        if arch in DEEPSEEK_ARCHS:
            _mla_weights(w, p, cfg, normal, norm_weight)
        elif arch == "phi3":
            w[p + "self_attn.qkv_proj.weight"] = normal((heads + 2 * kv) * head_dim, hidden)
        else:
            w[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
            w[p + "self_attn.k_proj.weight"] = normal(kv * head_dim, hidden)
            w[p + "self_attn.v_proj.weight"] = normal(kv * head_dim, hidden)
        if arch == "qwen2_moe":
            for part, n in (("q", heads), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{part}_proj.bias"] = normal(n * head_dim)
        if arch in ("qwen3_moe", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm_weight(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm_weight(head_dim)
        if arch == "olmoe":
            w[p + "self_attn.q_norm.weight"] = norm_weight(heads * head_dim)
            w[p + "self_attn.k_norm.weight"] = norm_weight(kv * head_dim)
        if arch not in DEEPSEEK_ARCHS:
            w[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        w[p + "post_attention_layernorm.weight"] = norm_weight(hidden)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm_weight(hidden)
            w[p + "post_feedforward_layernorm.weight"] = norm_weight(hidden)
        dense = (arch == "phi3" or gemma or i in (cfg.get("mlp_only_layers") or [])
                 or i < int(cfg.get("first_k_dense_replace") or 0))
        if dense and arch == "phi3":
            w[p + "mlp.gate_up_proj.weight"] = normal(2 * inter, hidden)
            w[p + "mlp.down_proj.weight"] = normal(hidden, inter)
            continue
        if dense:
            for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                ("down_proj", (hidden, inter))):
                w[p + f"mlp.{name}.weight"] = normal(*shape)
            continue
        block, names = (("block_sparse_moe", ("w1", "w3", "w2")) if arch == "mixtral"
                        else ("mlp", ("gate_proj", "up_proj", "down_proj")))
        w[p + f"{block}.gate.weight"] = normal(experts, hidden, scale=0.5)  # routing decided, not near-tied
        if arch == "deepseek_v3":  # the choosing-only bias
            w[p + "mlp.gate.e_score_correction_bias"] = normal(experts, scale=0.1)
        if arch in DEEPSEEK_ARCHS:  # n_shared_experts routed experts' width, as one MLP
            shared_width = width * int(cfg["n_shared_experts"])
            for name, shape in (("gate_proj", (shared_width, hidden)), ("up_proj", (shared_width, hidden)),
                                ("down_proj", (hidden, shared_width))):
                w[p + f"mlp.shared_experts.{name}.weight"] = normal(*shape)
        for e in range(experts):
            for name, shape in zip(names, ((width, hidden), (width, hidden), (hidden, width))):
                w[p + f"{block}.experts.{e}.{name}.weight"] = normal(*shape)
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        if shared:
            for name, shape in (("gate_proj", (shared, hidden)), ("up_proj", (shared, hidden)),
                                ("down_proj", (hidden, shared))):
                w[p + f"mlp.shared_expert.{name}.weight"] = normal(*shape)
            w[p + "mlp.shared_expert_gate.weight"] = normal(1, hidden)
    w["model.norm.weight"] = norm_weight(hidden)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(int(cfg["vocab_size"]), hidden)
