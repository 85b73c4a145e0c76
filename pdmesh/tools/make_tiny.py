"""``pdmesh model make-tiny``: write a small Hugging Face model folder with seeded weights.

No model can be downloaded on our machines, so tests and benchmarks use models the project
makes itself: a byte-level BPE tokenizer trained on the Python standard library's sources
and random weights from a seeded generator. The same arguments give byte-identical files.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from pdmesh.tools import TINY_ARCHS
from pdmesh.tools.tiny_families import DEEPSEEK_ARCHS, MOE_ARCHS, family_config, family_weights

Arch = Literal["llama", "qwen2", "qwen3", "phi3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3",
               "deepseek_v2", "deepseek_v3"]
ARCHS = TINY_ARCHS
Size = Literal["tiny", "small", "small-draft", "llama-8b"]

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_positions: int
    dtype: str = "float32"
    """The config's torch_dtype and the weights' dtype on disk."""
    experts: int = 8
    """Mixture-of-experts archs: routed experts per sparse layer, ..."""
    top_k: int = 2
    """... chosen per token, ..."""
    expert_intermediate: int = 32
    """... and each one's width (Qwen2-MoE's shared expert is four times it)."""


SHAPES: dict[str, Shape] = {
    "tiny": Shape(64, 2, 4, 2, 128, 1024, 2048),
    # Qwen3-30B-A3B's proportions for the MoE archs: 64 experts of a quarter of the hidden
    # width, 8 per token (the full model has 128 experts, 768 wide on 2,048).
    "small": Shape(512, 8, 8, 4, 2048, 8192, 4096, experts=64, top_k=8, expert_intermediate=128),
    # The small model's tokenizer (same vocabulary, same corpus) on a 2-layer body: a draft
    # model for it in speculative-decoding benchmarks (its random weights agree with the
    # small model's only by chance, so it measures the cost of drafting, not a speed-up).
    "small-draft": Shape(128, 2, 4, 2, 256, 8192, 4096),
    # Llama 3 8B's shape (GQA 32/8, 128k vocabulary), for GPU benchmarks: 16 GB in bf16.
    "llama-8b": Shape(4096, 32, 32, 8, 14336, 128256, 8192, "bfloat16"),
}
TOKENIZER_VOCAB = 8192
"""The most merges the corpus trains; a larger vocabulary is filled with added tokens
(``<|extra_N|>``), so that every id the model can sample decodes."""

# The corpus: a fixed, sorted list of standard-library modules (stable on one Python).
_CORPUS_MODULES = (
    "argparse", "ast", "asyncio/base_events", "collections/__init__", "contextlib", "csv",
    "dataclasses", "datetime", "difflib", "email/message", "enum", "fractions", "functools",
    "heapq", "inspect", "json/decoder", "logging/__init__", "pathlib", "pprint", "random",
    "shutil", "statistics", "string", "textwrap", "threading", "typing", "unittest/case",
    "urllib/parse", "uuid", "zipfile",
)


def corpus_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [root / f"{m}.py" for m in _CORPUS_MODULES]
    return [f for f in files if f.is_file()]


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE whose post-processor prepends BOS, like Llama 3's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in corpus_files()]
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def model_config(arch: Arch, shape: Shape, vocab: int, tok: Tokenizer) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "pad_token_id": tok.token_to_id(PAD),
        "torch_dtype": shape.dtype,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if arch == "llama":
        cfg.update(
            architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False,
            attention_bias=False, mlp_bias=False, rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
            },
        )
    elif arch == "qwen2":
        cfg.update(
            architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=True,
            rope_theta=1000000.0, use_sliding_window=False, sliding_window=None,
            max_window_layers=shape.layers,
        )
    elif arch == "qwen3":
        cfg.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True,
            rope_theta=1000000.0, head_dim=2 * shape.hidden // shape.heads,
            attention_bias=False, use_sliding_window=False, sliding_window=None,
            max_window_layers=shape.layers,
        )
    else:
        cfg.update(family_config(arch, shape.hidden, shape.heads, shape.max_positions, shape.layers,
                                 shape.experts, shape.top_k, shape.expert_intermediate))
    return cfg


def random_weights(cfg: dict[str, Any], seed: int, device: str = "cpu",
                   dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """HF-named tensors drawn in a fixed order from one seeded generator on ``device``
    (a GPU draws an 8B model in seconds; its draws differ from the CPU's), on the CPU in
    ``dtype``."""
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg["num_key_value_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg["intermediate_size"])
    vocab = int(cfg["vocab_size"])
    arch = cfg["model_type"]
    std = float(cfg["initializer_range"])

    def normal(*shape: int, scale: float = std, mean: float = 0.0) -> torch.Tensor:
        draw = torch.randn(*shape, generator=g, device=device) * scale
        return (draw + mean if mean else draw).to(dtype).cpu()  # the mean added before rounding to dtype

    def norm_weight(n: int) -> torch.Tensor:
        return normal(n, scale=0.1, mean=1.0)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(vocab, hidden)}
    if arch in ("phi3", *MOE_ARCHS, "gemma2", "gemma3_text", *DEEPSEEK_ARCHS):  # Gemma 3's model_type: gemma3_text
        family_weights(w, cfg, normal, norm_weight)
        return w
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(hidden)
        w[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = normal(kv * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = normal(kv * head_dim, hidden)
        if arch == "qwen2":
            w[p + "self_attn.q_proj.bias"] = normal(heads * head_dim)
            w[p + "self_attn.k_proj.bias"] = normal(kv * head_dim)
            w[p + "self_attn.v_proj.bias"] = normal(kv * head_dim)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm_weight(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm_weight(head_dim)
        w[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        w[p + "post_attention_layernorm.weight"] = norm_weight(hidden)
        w[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        w[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        w[p + "mlp.down_proj.weight"] = normal(hidden, inter)
    w["model.norm.weight"] = norm_weight(hidden)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(vocab, hidden)
    return w


def save_weights(weights: dict[str, torch.Tensor], out: Path, max_shard_bytes: int | None) -> None:
    meta = {"format": "pt"}
    if not max_shard_bytes:
        save_file(weights, str(out / "model.safetensors"), metadata=meta)
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in weights.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata=meta)
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))


def make_tiny(
    out: str | Path,
    arch: Arch = "llama",
    size: Size = "tiny",
    seed: int = 0,
    max_shard_bytes: int | None = None,
    device: str = "cpu",
) -> Path:
    """Write the model folder and return its path; ``device`` draws the weights."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if size not in SHAPES:
        raise ValueError(f"size must be one of {sorted(SHAPES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[size]
    tok = train_tokenizer(min(shape.vocab, TOKENIZER_VOCAB))
    trained = tok.get_vocab_size(with_added_tokens=True)
    if shape.vocab > TOKENIZER_VOCAB:
        tok.add_tokens([f"<|extra_{i}|>" for i in range(shape.vocab - trained)])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    cfg = model_config(arch, shape, vocab, tok)
    save_weights(random_weights(cfg, seed, device, getattr(torch, shape.dtype)), out, max_shard_bytes)
    _dump(out / "config.json", cfg)
    _dump(out / "generation_config.json", {
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg["pad_token_id"], "do_sample": False,
    })
    tok.save(str(out / "tokenizer.json"))
    _dump(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "pad_token": PAD, "add_bos_token": False, "model_max_length": shape.max_positions,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
    })
    return out


def _dump(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
