"""The newer families load from folders transformers itself saves (its config classes, its
checkpoint names), sharded or not, and what pdmesh cannot serve exactly is refused at
start-up naming the tensor or field: a missing expert, a wrong shape, a quantization."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pdmesh import LLM, SamplingParams
from pdmesh.errors import UnsupportedModelError
from pdmesh.model.config import ARCHITECTURES, ModelConfig
from pdmesh.model.layers import RotaryEmbedding, longrope_inv_freq
from tests.oracle import mixed_prompts


def _hf_saved(tmp_path: Path, tokenizer_dir: Path, arch: str, shard: bool = False) -> Path:
    """A model transformers builds from its own config class and saves (its init, seeded)."""
    import transformers as tf

    common = {"vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 512, "bos_token_id": 0, "eos_token_id": 1,
              "pad_token_id": 2, "tie_word_embeddings": False}
    configs = {
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 32,
            "norm_topk_prob": True, "decoder_sparse_step": 2, "mlp_only_layers": [2], "intermediate_size": 96}),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
            "num_experts": 8, "num_experts_per_tok": 4, "moe_intermediate_size": 32, "intermediate_size": 96,
            "shared_expert_intermediate_size": 48}),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM", {
            "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48}),
        "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {
            "num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, "clip_qkv": 3.0}),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", {
            "intermediate_size": 96, "original_max_position_embeddings": 256,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                             "long_factor": [2.0 + 0.5 * i for i in range(8)],
                             "original_max_position_embeddings": 256}}),
        # Sliding windows shorter than most prompts here (up to 150 tokens): every layer's
        # (Mistral), the layers from max_window_layers on (Qwen2), Gemma's local layers.
        "mistral": ("MistralConfig", "MistralForCausalLM", {"intermediate_size": 96, "sliding_window": 20}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {
            "intermediate_size": 96, "use_sliding_window": True, "sliding_window": 20, "max_window_layers": 1}),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
            "intermediate_size": 96, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 20,
            "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0}),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
            "intermediate_size": 96, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 20,
            "sliding_window_pattern": 3, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
        # gpt-oss: sinks, alternating 20-token windows, YaRN past a 64-token original context,
        # biased clamped-SwiGLU experts in one fused tensor per layer.
        "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {
            "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32, "head_dim": 16,
            "sliding_window": 20, "rope_parameters": {
                "rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "original_max_position_embeddings": 64,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}}),
        # DeepSeek-V3: latent attention (q and kv compressions, a shared interleaved rotary
        # key, YaRN's mscale on the scores), a dense first layer, grouped sigmoid routing
        # and a shared expert; weights drawn wide enough that attention decides tokens.
        "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
            "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
            "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "q_lora_rank": 48, "kv_lora_rank": 32,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "initializer_range": 0.1,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 128, "mscale": 1.0, "mscale_all_dim": 1.0}}),
        # DeepSeek-V2: the same attention with queries through one projection (as its Lite
        # model), rotary pairs rotated in place, group-limited softmax routing, two shared experts.
        "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
            "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "n_shared_experts": 2, "topk_method": "group_limited_greedy", "n_group": 4,
            "topk_group": 2, "first_k_dense_replace": 1, "routed_scaling_factor": 1.5, "q_lora_rank": None,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "initializer_range": 0.1,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 128, "mscale": 1.0, "mscale_all_dim": 1.0}}),
    }
    config_cls, model_cls, extra = configs[arch]
    torch.manual_seed(7)
    model = getattr(tf, model_cls)(getattr(tf, config_cls)(**(common | extra))).eval()
    if arch == "gpt_oss":  # its init leaves the sinks near 0, where a missing sink would pass unseen
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    if arch == "deepseek_v3":  # a correction bias that changes which experts are chosen
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    out = tmp_path / f"hf-{arch}"
    model.save_pretrained(out, max_shard_size="200KB" if shard else "5GB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "phi3", "mistral", "qwen2", "gemma2",
                                  "gemma3", "gpt_oss", "deepseek_v2", "deepseek_v3"])
def test_a_folder_transformers_saved_serves_its_greedy_tokens(tmp_path: Path, llama_dir: Path, arch: str) -> None:
    """Qwen3-MoE here has dense and sparse layers (decoder_sparse_step, mlp_only_layers), the
    checkpoint sharded; Qwen2-MoE a shared expert and 4 of 8 experts; OLMoE clipped q/k/v;
    Mistral, Qwen2 and Gemma sliding windows (Gemma 3's pattern as Hub configs give it);
    gpt-oss sinks and YaRN; DeepSeek-V3 latent attention over a latent cache, DeepSeek-V2 the
    same with one query projection, rotary pairs in place and group-limited softmax routing."""
    from transformers import AutoModelForCausalLM

    path = _hf_saved(tmp_path, llama_dir, arch, shard=arch == "qwen3_moe")
    if arch == "qwen3_moe":
        assert (path / "model.safetensors.index.json").is_file()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # EOS is a token like any other, as with ignore_eos
    prompts = mixed_prompts(6, seed=13)
    want = []
    for p in prompts:
        ids = torch.tensor([p])
        want.append(hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=12)[0, len(p):].tolist())
    llm = LLM(str(path), dtype="float32", num_blocks=128, max_num_batched_tokens=40)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12,
                                                                                ignore_eos=True))]
    assert got == want
    assert llm.engine.stats().used == 0


def test_the_moe_fields_are_read_as_each_family_names_them() -> None:
    base = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2,
            "intermediate_size": 40}
    qwen = ModelConfig.from_dict(base | {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 16,
                                         "num_experts_per_tok": 4, "moe_intermediate_size": 8,
                                         "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": True})
    assert qwen.moe is not None and qwen.moe.sparse_layers == {1} and qwen.moe.norm_topk_prob and qwen.qk_norm
    saved_by_v5 = ModelConfig.from_dict(base | {"architectures": ["Qwen3MoeForCausalLM"], "num_local_experts": 16,
                                                "num_experts_per_tok": 4, "moe_intermediate_size": 8})
    assert saved_by_v5.moe is not None and saved_by_v5.moe.num_experts == 16
    mixtral = ModelConfig.from_dict(base | {"architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                                            "num_experts_per_tok": 2})
    assert mixtral.moe is not None and mixtral.moe.intermediate_size == 40 and mixtral.moe.norm_topk_prob
    shared = ModelConfig.from_dict(base | {"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 8,
                                           "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                                           "shared_expert_intermediate_size": 32})
    assert shared.moe is not None and shared.moe.shared_intermediate_size == 32 and shared.qkv_bias


def test_phi3s_longrope_rotates_as_transformers_below_the_original_context_and_long_past_it() -> None:
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(4)],
            "long_factor": [3.0 + i for i in range(4)], "original_max_position_embeddings": 64}
    hf_cfg = Phi3Config(hidden_size=32, num_attention_heads=4, max_position_embeddings=256,
                        original_max_position_embeddings=64, rope_scaling=rope)
    short, attention = ROPE_INIT_FUNCTIONS["longrope"](hf_cfg, "cpu")
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf_cfg, "cpu", seq_len=65)
    ours = ModelConfig.from_dict(hf_cfg.to_dict() | {"architectures": ["Phi3ForCausalLM"]}).rope
    assert torch.equal(longrope_inv_freq(ours, 8, long=False), short)
    assert torch.equal(longrope_inv_freq(ours, 8, long=True), long)
    assert ours.attention_factor == pytest.approx(attention, rel=1e-12) and attention > 1.0
    tables = RotaryEmbedding(ours, 8, 256)
    assert torch.equal(tables.cos[63, :4], (63 * short).cos() * attention)
    assert torch.equal(tables.cos[64, :4], (64 * long).cos() * attention)  # the long factors from here on
    legacy = ModelConfig.from_dict(hf_cfg.to_dict() | {"architectures": ["Phi3ForCausalLM"],
                                                       "rope_scaling": rope | {"type": "su"}, "rope_parameters": None})
    assert legacy.rope == ours  # Phi-3's first name for it


def test_unsupported_architectures_list_what_is_served() -> None:
    with pytest.raises(UnsupportedModelError) as err:
        ModelConfig.from_dict({"architectures": ["Glm4MoeForCausalLM"]})
    assert all(a in str(err.value) for a in ARCHITECTURES) and "README.md, 'Model families'" in str(err.value)


@pytest.fixture()
def moe_copy(model_dirs: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dirs["qwen3_moe"], tmp_path / "qwen3_moe"))


def _rewrite(folder: Path, change) -> None:  # type: ignore[no-untyped-def]
    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_a_missing_expert_is_named_as_the_checkpoint_names_it(moe_copy: Path) -> None:
    _rewrite(moe_copy, lambda w: w.pop("model.layers.1.mlp.experts.5.up_proj.weight"))
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight"):
        LLM(str(moe_copy), dtype="float32", num_blocks=32)


def test_an_expert_of_the_wrong_shape_is_named(moe_copy: Path) -> None:
    def shrink(w: dict[str, torch.Tensor]) -> None:
        w["model.layers.0.mlp.experts.2.down_proj.weight"] = w["model.layers.0.mlp.experts.2.down_proj.weight"][:, :-1].contiguous()

    _rewrite(moe_copy, shrink)
    with pytest.raises(UnsupportedModelError, match=r"'model\.layers\.0\.mlp\.experts\.2\.down_proj\.weight' has "
                                                    r"shape \(64, 31\), expected \(64, 32\)"):
        LLM(str(moe_copy), dtype="float32", num_blocks=32)


@pytest.mark.parametrize("method", ["fp8", "awq", "gptq", "mxfp4"])
def test_a_quantized_checkpoint_is_refused_naming_its_method(moe_copy: Path, method: str) -> None:
    raw = json.loads((moe_copy / "config.json").read_text())
    (moe_copy / "config.json").write_text(json.dumps(raw | {"quantization_config": {"quant_method": method}}))
    with pytest.raises(UnsupportedModelError, match=f"quantization_config \\(quant_method='{method}'\\) is not "
                                                    "implemented"):
        LLM(str(moe_copy), dtype="float32", num_blocks=32)


def test_weights_and_pool_that_cannot_fit_are_refused_before_loading(model_dirs: dict[str, Path]) -> None:
    from pdmesh.model.loader import load_model, safetensors_files
    from pdmesh.model.memory import GIB, InsufficientMemoryError, check_fits, checkpoint_elements

    folder = model_dirs["qwen3_moe"]
    model, _, _ = load_model(folder, "float32")
    assert checkpoint_elements(safetensors_files(folder)) == sum(p.numel() for p in model.parameters())
    with pytest.raises(InsufficientMemoryError, match=r"weights \(40\.00 GiB at the dtype they run in\) and the KV "
                                                      r"pool \(2\.00 GiB\) need 42\.00 GiB, and cuda:0 has 24\.00 GiB free"):
        check_fits(40 * GIB, 2 * GIB, 24 * GIB, "cuda:0")
    with pytest.raises(InsufficientMemoryError, match="this host has"):  # a real pool this host cannot hold
        LLM(str(folder), dtype="float32", kv_cache_memory_gb=1 << 20)
