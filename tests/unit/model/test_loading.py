"""HF folder loading: config parsing, unsupported fields, sharded safetensors, dtypes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from pdmesh import LLM, SamplingParams
from pdmesh.errors import UnsupportedModelError
from pdmesh.model.config import ModelConfig
from pdmesh.model.layers import rope_inv_freq
from pdmesh.tools.make_tiny import make_tiny
from tests.oracle import mixed_prompts


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_type='dynamic'"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({"layer_types": ["chunked_attention", "full_attention"]}, "chunked_attention"),
    ],
)
def test_unsupported_fields_are_named(llama_dir: Path, change: dict, needle: str) -> None:
    raw = _config(llama_dir) | change
    with pytest.raises(UnsupportedModelError, match=needle.replace("(", r"\(")):
        ModelConfig.from_dict(raw)


def test_old_and_new_rope_formats_agree(llama_dir: Path) -> None:
    raw = _config(llama_dir)
    old = ModelConfig.from_dict(raw)
    new_raw = {k: v for k, v in raw.items() if k not in ("rope_theta", "rope_scaling")}
    new_raw["rope_parameters"] = raw["rope_scaling"] | {"rope_theta": raw["rope_theta"]}
    assert ModelConfig.from_dict(new_raw).rope == old.rope
    assert old.rope.rope_type == "llama3"


def test_llama3_inv_freq_matches_transformers(llama_dir: Path) -> None:
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = AutoConfig.from_pretrained(llama_dir)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = rope_inv_freq(ModelConfig.from_dir(llama_dir).rope, 16)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("extra", [{}, {"beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}])
def test_yarn_inv_freq_and_scale_match_transformers(llama_dir: Path, extra: dict) -> None:
    """gpt-oss ships YaRN; its frequencies and attention factor must be transformers' own."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = _config(llama_dir) | {
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64} | extra,
    }
    (llama_dir.parent / "yarn").mkdir(exist_ok=True)
    (llama_dir.parent / "yarn" / "config.json").write_text(json.dumps(raw))
    hf_cfg = AutoConfig.from_pretrained(llama_dir.parent / "yarn")
    ref, ref_scale = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu")
    rope = ModelConfig.from_dict(raw).rope
    assert torch.equal(rope_inv_freq(rope, 16), ref)
    assert rope.attention_factor == pytest.approx(ref_scale, abs=0.0)


def test_sharded_checkpoint_loads_identically(tmp_path: Path, llama_dir: Path) -> None:
    sharded = make_tiny(tmp_path / "sharded", "llama", "tiny", seed=0, max_shard_bytes=200_000)
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    prompts = mixed_prompts(3)
    params = SamplingParams(temperature=0, max_tokens=8)
    a = LLM(str(sharded), dtype="float32", num_blocks=64).generate(prompts, params)
    b = LLM(str(llama_dir), dtype="float32", num_blocks=64).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


def test_missing_weight_is_reported(tmp_path: Path, llama_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, broken / "model.safetensors")
    with pytest.raises(UnsupportedModelError, match="missing"):
        LLM(str(broken), num_blocks=8)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs(llama_dir: Path, dtype: str) -> None:
    out = LLM(str(llama_dir), dtype=dtype, num_blocks=64).generate(
        mixed_prompts(3), SamplingParams(temperature=0, max_tokens=6)
    )
    assert all(len(o.outputs[0].token_ids) == 6 for o in out)


def test_make_tiny_is_byte_identical_for_a_seed(tmp_path: Path) -> None:
    def digest(path: Path) -> dict[str, str]:
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}

    a = digest(make_tiny(tmp_path / "a", "qwen3", "tiny", seed=3))
    b = digest(make_tiny(tmp_path / "b", "qwen3", "tiny", seed=3))
    c = digest(make_tiny(tmp_path / "c", "qwen3", "tiny", seed=4))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert set(a) == {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    }


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tokenizer_and_chat_template_match_transformers(model_dirs, arch: str) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from pdmesh.tokenizer import Tokenizer

    path = model_dirs[arch]
    ours, ref = Tokenizer(path), AutoTokenizer.from_pretrained(path)
    for text in ["def f(x):\n    return x", "naïve café ✓ 中文", "  spaces\tand\ttabs  "]:
        assert ours.encode(text) == ref(text).input_ids
        assert ours.decode(ours.encode(text)) == text
    msgs = [{"role": "user", "content": "hello"}]
    assert ours.apply_chat_template(msgs) == ref.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
