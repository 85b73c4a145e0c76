"""Absorbed MLA decode (attention on the latent, the CPU kernels' path) against the
reference formulation (every context expanded through kv_b, transformers' order): the same
attention output to float32 rounding, over ragged contexts and in bfloat16."""

from __future__ import annotations

import pytest
import torch

from pdmesh.attention.backend import AttentionMetadata
from pdmesh.attention.cpu_kernels import load
from pdmesh.model.config import ModelConfig
from pdmesh.model.mla import MLAAttention

BLOCK = 16


def _config(heads: int, rank: int, nope: int, rope: int, v: int) -> ModelConfig:
    from transformers import DeepseekV3Config

    hf = DeepseekV3Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads,
                          q_lora_rank=32, kv_lora_rank=rank, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                          v_head_dim=v, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                          n_group=1, topk_group=1, vocab_size=64, first_k_dense_replace=1)
    raw = hf.to_dict() | {"architectures": ["DeepseekV3ForCausalLM"]}
    return ModelConfig.from_dict(raw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 32, 16, 8, 16), (16, 64, 32, 16, 24)], ids=["tiny", "wide"])
def test_attention_on_the_latent_equals_the_expanded_keys_and_values(shape, dtype) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = _config(*shape)
    assert cfg.mla is not None
    attn = MLAAttention(cfg, 0).to(dtype)
    attn.kernels = load()
    lens = torch.tensor([1, 17, 40, 95, 64], dtype=torch.long)
    width = int((lens.max() + BLOCK - 1) // BLOCK)
    blocks = torch.randperm(64)[: len(lens) * width].view(len(lens), width)
    kv_layer = torch.randn(64, 1, BLOCK, 1, cfg.mla.latent_dim).to(dtype)
    meta = AttentionMetadata(num_decodes=len(lens), slot_blocks=torch.zeros(0, dtype=torch.long),
                             slot_offsets=torch.zeros(0, dtype=torch.long),
                             decode_block_tables=blocks.contiguous(), decode_seq_lens=lens)
    q = torch.randn(len(lens), cfg.num_heads, cfg.mla.qk_head_dim).to(dtype)
    q_nope, q_rot = q.split([cfg.mla.qk_nope_head_dim, cfg.mla.qk_rope_head_dim], dim=-1)
    with torch.no_grad():
        absorbed = attn._decode_absorbed(q_nope, q_rot, kv_layer, meta)
        reference = attn._decode(q, kv_layer[:, 0, :, 0], meta)
    assert absorbed.shape == reference.shape == (len(lens), cfg.num_heads, cfg.mla.v_head_dim)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(absorbed.float(), reference.float(), rtol=tol, atol=tol)


def test_the_absorbed_path_needs_the_kernels() -> None:
    cfg = _config(4, 32, 16, 8, 16)
    attn = MLAAttention(cfg, 0)
    meta = AttentionMetadata(num_decodes=1, slot_blocks=torch.zeros(0, dtype=torch.long),
                             slot_offsets=torch.zeros(0, dtype=torch.long))
    with pytest.raises(RuntimeError, match="CPU kernels"):
        attn._decode_absorbed(torch.zeros(1, 4, 16), torch.zeros(1, 4, 8), torch.zeros(1, 1, BLOCK, 1, 40), meta)
