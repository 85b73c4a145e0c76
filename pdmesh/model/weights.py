"""Checkpoint tensor names -> where each lands in pdmesh's decoder, one table per family.

A checkpoint tensor becomes one or more writes into a parameter: whole (a norm), a run of
rows (q, k and v into the fused ``qkv``), one expert's slice of a stacked expert tensor,
or one tensor split in two (Phi-3's fused ``gate_up_proj``). The loader counts what every
write covers, so a checkpoint missing a tensor, or one with the wrong shape, is refused
naming it instead of serving from uninitialised memory.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdmesh.model.config import ModelConfig

Index = tuple[int | slice, ...]


@dataclass(frozen=True)
class Write:
    param: str
    """pdmesh's parameter name."""
    dest: Index = ()
    """Where in the parameter (``()``: all of it)."""
    src: Index = ()
    """Which part of the checkpoint tensor (``()``: all of it)."""
    fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Rearranges that part into pdmesh's layout (gpt-oss's experts)."""


_DENSE = {
    "self_attn.o_proj": "attn.o",
    "self_attn.q_norm": "attn.q_norm",
    "self_attn.k_norm": "attn.k_norm",
    "mlp.down_proj": "mlp.down",
    "mlp.gate_proj": "mlp.gate",
    "mlp.up_proj": "mlp.up",
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attn_norm",
    "self_attn.qkv_proj": "attn.qkv",  # Phi-3 stores q, k and v fused, in pdmesh's order
}
_SANDWICH = {
    "post_attention_layernorm": "attn_out_norm",  # Gemma: on the attention's output
    "pre_feedforward_layernorm": "post_attn_norm",  # the MLP's input norm, as Llama's post-attention one
    "post_feedforward_layernorm": "mlp_out_norm",
}
"""Gemma 2/3's four norms a layer (``ModelConfig.sandwich_norms``)."""
_MOE = {
    "mlp.gate": "mlp.router.gate",  # Qwen2/3-MoE, OLMoE
    "block_sparse_moe.gate": "mlp.router.gate",  # Mixtral
    "mlp.shared_expert.gate_proj": "mlp.shared.gate",
    "mlp.shared_expert.up_proj": "mlp.shared.up",
    "mlp.shared_expert.down_proj": "mlp.shared.down",
    "mlp.shared_expert_gate": "mlp.shared_gate",
    "mlp.router": "mlp.router.gate",  # gpt-oss
    "mlp.shared_experts.gate_proj": "mlp.shared.gate",  # DeepSeek-V3
    "mlp.shared_experts.up_proj": "mlp.shared.up",
    "mlp.shared_experts.down_proj": "mlp.shared.down",
}
_EXPERT = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)$")
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
def _halves(t: torch.Tensor) -> torch.Tensor:
    """gpt-oss's gate and up columns, interleaved (g0 u0 g1 u1 ...), as gate's then up's."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


_GPT_OSS_EXPERTS: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "gate_up_proj": ("gate_up", lambda t: _halves(t).transpose(1, 2)),  # [E, H, 2I] -> [E, 2I, H]
    "gate_up_proj_bias": ("gate_up_bias", _halves),
    "down_proj": ("down", lambda t: t.transpose(1, 2)),  # [E, I, H] -> [E, H, I]
    "down_proj_bias": ("down_bias", lambda t: t),
}
"""gpt-oss's stacked experts (inputs on the rows), into pdmesh's [E, out, in] layout."""
_STACKED = {"mlp.experts.gate_up_proj": "mlp.experts.gate_up", "mlp.experts.down_proj": "mlp.experts.down"}
"""Experts already stacked, as transformers 5 keeps them in memory."""


def weight_writes(name: str, cfg: ModelConfig) -> list[Write] | None:
    """Where checkpoint tensor ``name`` goes (None: nothing, e.g. a rotary cache); an
    unknown name maps to itself, which the loader then refuses as having no place."""
    if name.endswith("rotary_emb.inv_freq"):
        return None
    top = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
           "lm_head.weight": "lm_head.weight"}
    if name in top:
        return [Write(top[name])]
    prefix = "model.layers."
    if not name.startswith(prefix):
        return [Write(name)]
    idx, rest = name[len(prefix):].split(".", 1)
    module, leaf = rest.rsplit(".", 1)
    at = f"layers.{idx}."
    if cfg.mla is not None:
        if int(idx) >= cfg.num_layers:  # DeepSeek-V3's multi-token-prediction layer, unused (as transformers)
            return None
        if module.startswith("self_attn.") and module != "self_attn.o_proj":  # MLA's projections keep their names
            return [Write(f"{at}attn.{module[len('self_attn.'):]}.{leaf}")]
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    rows = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
    if module.startswith("self_attn.") and module[len("self_attn."):] in rows:
        return [Write(f"{at}attn.qkv.{leaf}", (rows[module[len("self_attn."):]],))]
    if module == "mlp.gate_up_proj" and (cfg.moe is None or not cfg.moe.is_sparse(int(idx))):  # Phi-3
        half = cfg.intermediate_size
        return [Write(f"{at}mlp.gate.{leaf}", src=(slice(0, half),)),
                Write(f"{at}mlp.up.{leaf}", src=(slice(half, 2 * half),))]
    if (m := _EXPERT.match(module)) is not None and cfg.moe is not None:
        e, part, width = int(m.group(1)), _EXPERT_PART[m.group(2)], cfg.moe.intermediate_size
        if part == "down":
            return [Write(f"{at}mlp.experts.down", (e,))]
        span = slice(0, width) if part == "gate" else slice(width, 2 * width)
        return [Write(f"{at}mlp.experts.gate_up", (e, span))]
    if module == "self_attn" and leaf == "sinks":  # gpt-oss
        return [Write(f"{at}attn.sinks")]
    if cfg.family == "gpt_oss" and module == "mlp.experts" and leaf in _GPT_OSS_EXPERTS:
        param, fn = _GPT_OSS_EXPERTS[leaf]
        return [Write(f"{at}mlp.experts.{param}", fn=fn)]
    if f"{module}.{leaf}" in _STACKED:
        return [Write(f"{at}{_STACKED[f'{module}.{leaf}']}")]
    if module == "mlp.gate" and leaf == "e_score_correction_bias":  # DeepSeek-V3's router
        return [Write(f"{at}mlp.router.e_score_correction_bias")]
    target = _MOE.get(module) if cfg.moe is not None else _SANDWICH.get(module) if cfg.sandwich_norms else None
    return [Write(f"{at}{target or _DENSE.get(module, module)}.{leaf}")]


IndexKey = tuple[int | tuple[int | None, int | None], ...]


def index_key(index: Index) -> IndexKey:
    """``index`` as a set member (slices are unhashable before Python 3.12)."""
    return tuple((i.start, i.stop) if isinstance(i, slice) else i for i in index)


def missing_parts(param: str, written: set[IndexKey], cfg: ModelConfig) -> str:
    """A parameter the checkpoint did not fill, named as the checkpoint would name what is
    missing: the experts of a stacked expert tensor that no tensor was written to."""
    stacked = re.match(r"^layers\.(\d+)\.mlp\.experts\.(gate_up|down)$", param)
    if stacked is None or cfg.moe is None:
        return param
    layer, which, width = stacked.group(1), stacked.group(2), cfg.moe.intermediate_size
    names = {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}
    experts = range(cfg.moe.num_experts)
    expected: list[tuple[int, Index, str]] = (
        [(e, (e,), "down") for e in experts] if which == "down" else
        [(e, (e, slice(0, width)), "gate") for e in experts]
        + [(e, (e, slice(width, 2 * width)), "up") for e in experts])
    absent = sorted((e, part) for e, dest, part in expected if index_key(dest) not in written)
    ckpt = f"model.layers.{layer}"
    shown = [f"{ckpt}.mlp.experts.{e}.{names[p][0]}.weight (Mixtral: block_sparse_moe.experts.{e}.{names[p][1]})"
             for e, p in absent[:4]]
    more = f" and {len(absent) - 4} more" if len(absent) > 4 else ""
    return ", ".join(shown) + more if absent else param
