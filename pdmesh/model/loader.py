"""Load a Hugging Face model folder: config.json + (sharded) safetensors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from pdmesh.errors import UnsupportedModelError
from pdmesh.kv.layout import resolve_dtype_name
from pdmesh.model.config import ModelConfig
from pdmesh.model.llama import LlamaForCausalLM
from pdmesh.startup import set_phase

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(requested: str, cfg: ModelConfig, device: str = "cpu") -> torch.dtype:
    """The torch dtype to run in (see ``resolve_dtype_name``)."""
    return _DTYPES[resolve_dtype_name(requested, cfg, device)]


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a folder, following ``model.safetensors.index.json`` when sharded."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise UnsupportedModelError(f"{path}: no model.safetensors or model.safetensors.index.json")


def iter_weights(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = safetensors_files(path)
    for i, file in enumerate(files):
        set_phase(f"loading weights {i + 1}/{len(files)} shards")
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - a safetensors handle lists its names only so
                yield name, f.get_tensor(name)


def load_model(
    path: str | Path, dtype: str = "auto", device: str = "cpu", max_positions: int | None = None
) -> tuple[LlamaForCausalLM, ModelConfig, torch.dtype]:
    """Build the decoder for ``path`` and load its weights."""
    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    torch_dtype = resolve_dtype(dtype, cfg, device)
    with torch.device(device):
        model = LlamaForCausalLM(cfg, max_positions or cfg.max_position_embeddings)
    model.to(dtype=torch_dtype)
    with torch.device(device):
        model.build_rotary(max_positions or cfg.max_position_embeddings)
    model.load_weights(iter_weights(path))
    model.eval()
    return model, cfg, torch_dtype
