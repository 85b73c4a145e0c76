"""Which layers slide, and by how much, read from each family's own fields: transformers 5's
``layer_types``, Mistral's one window for every layer, Qwen2's ``max_window_layers``, the
older Gemma 3 configs on the Hub (``sliding_window_pattern``, ``rope_local_base_freq``); and
what pdmesh cannot attend is refused naming it."""

from __future__ import annotations

import pytest
import torch

from pdmesh.attention.backend import PrefillSeq
from pdmesh.errors import InvalidRequestError, UnsupportedModelError
from pdmesh.model.attention_config import LayerAttention
from pdmesh.model.config import ModelConfig

BASE = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2,
        "intermediate_size": 40}


def _windows(cfg: ModelConfig) -> list[int | None]:
    return [a.window for a in cfg.layer_attention]


def test_mistral_slides_on_every_layer_and_llama_on_none() -> None:
    mistral = ModelConfig.from_dict(BASE | {"architectures": ["MistralForCausalLM"], "sliding_window": 32})
    assert _windows(mistral) == [32] * 4 and mistral.attention_variants == ("sliding windows",)
    unset = ModelConfig.from_dict(BASE | {"architectures": ["MistralForCausalLM"], "sliding_window": None})
    assert _windows(unset) == [None] * 4 and unset.attention_variants == ()


def test_qwen2_slides_from_max_window_layers_only_when_switched_on() -> None:
    on = ModelConfig.from_dict(BASE | {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                                       "sliding_window": 16, "max_window_layers": 3})
    assert _windows(on) == [None, None, None, 16]
    off = ModelConfig.from_dict(BASE | {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False,
                                        "sliding_window": 16, "layer_types": ["sliding_attention"] * 4})
    assert _windows(off) == [None] * 4  # transformers drops the window: every layer is full


def test_a_hub_gemma3_config_reads_its_pattern_and_both_rotary_tables() -> None:
    hub = BASE | {"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 7, "sliding_window": 512,
                  "sliding_window_pattern": 6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
                  "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 256,
                  "hidden_activation": "gelu_pytorch_tanh", "head_dim": 256}
    cfg = ModelConfig.from_dict(hub)
    assert _windows(cfg) == [512] * 5 + [None, 512]
    assert [a.local_rope for a in cfg.layer_attention] == [True] * 5 + [False, True]
    assert (cfg.rope.theta, cfg.rope.rope_type, cfg.rope.factor) == (1_000_000.0, "linear", 8.0)
    assert cfg.local_rope is not None and (cfg.local_rope.theta, cfg.local_rope.rope_type) == (10000.0, "default")
    assert cfg.scale == 256**-0.5 and cfg.activation == "gelu_tanh" and cfg.embed_scale == 4.0
    assert cfg.tie_word_embeddings and cfg.qk_norm and cfg.sandwich_norms and cfg.norm_offset == 1.0


def test_gemma2_caps_every_layer_and_alternates_windows() -> None:
    cfg = ModelConfig.from_dict(BASE | {"architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096,
                                        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
    assert cfg.layer_attention == (LayerAttention(4096, 50.0), LayerAttention(None, 50.0)) * 2
    assert cfg.final_softcap == 30.0 and not cfg.qk_norm
    assert cfg.attention_variants == ("sliding windows", "soft-capped scores")


@pytest.mark.parametrize(("change", "needle"), [
    ({"layer_types": ["chunked_attention"] * 4}, "chunked_attention"),
    ({"layer_types": ["full_attention"] * 3}, "names 3 layers, the model has 4"),
    ({"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
])
def test_what_gemma_cannot_be_served_as_is_named(change: dict, needle: str) -> None:
    with pytest.raises(UnsupportedModelError, match=needle):
        ModelConfig.from_dict(BASE | {"architectures": ["Gemma3ForCausalLM"]} | change)


def test_a_window_masks_keys_before_it_in_a_chunk_with_or_without_a_prefix() -> None:
    chunk = PrefillSeq(q_start=0, q_len=3, ctx_len=7, block_ids=torch.zeros(1, dtype=torch.long))
    mask = chunk.mask(window=3)
    assert mask is not None and mask.int().tolist() == [
        [0, 0, 1, 1, 1, 0, 0],  # position 4 sees 2..4
        [0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1],
    ]
    alone = PrefillSeq(q_start=0, q_len=4, ctx_len=4, block_ids=torch.zeros(1, dtype=torch.long))
    assert alone.mask() is None and alone.mask(window=4) is None  # plain causal either way
    assert alone.mask(window=2).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]


def test_flashinfer_refuses_a_model_whose_layers_it_would_attend_wrongly() -> None:
    from pdmesh.attention.flashinfer_backend import FlashInferBackend

    with pytest.raises(InvalidRequestError, match="sliding windows and soft-capped scores; use --attention-backend"):
        FlashInferBackend("cuda", torch.bfloat16, 64, ("sliding windows", "soft-capped scores"))
