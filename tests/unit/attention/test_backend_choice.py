"""Which attention backend and dtype an engine gets, and the errors that say what to change.

The GPU side of this (flashinfer picked on CUDA for bf16, graphs captured) runs in tests/gpu;
here, what holds on any machine: the CUDA defaults as pure decisions, and the messages."""

from __future__ import annotations

import sys

import pytest
import torch

from pdmesh.attention.flashinfer_backend import FlashInferBackend, import_flashinfer
from pdmesh.attention.select import build_backend
from pdmesh.engine.cuda_graphs import graph_batches
from pdmesh.errors import InvalidRequestError
from pdmesh.kv.layout import resolve_dtype_name
from pdmesh.model.config import ModelConfig


def test_flashinfer_missing_is_an_error_that_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # as on a machine without it
    with pytest.raises(InvalidRequestError, match=r"pip install 'pdmesh\[gpu\]' \(flashinfer-python==0.6.18.post1\)"):
        import_flashinfer()


def test_flashinfer_on_a_cpu_or_in_float32_is_an_error_that_says_what_to_use() -> None:
    with pytest.raises(InvalidRequestError, match="runs on CUDA devices, not cpu"):
        build_backend("flashinfer", "cpu", torch.bfloat16, 64)
    with pytest.raises(InvalidRequestError, match="not torch.float32; use --dtype bfloat16 or --attention-backend torch"):
        FlashInferBackend("cuda", torch.float32, 64)
    with pytest.raises(InvalidRequestError, match=r"head_dim \(64, 128, 256\), not this model's 16"):
        FlashInferBackend("cuda", torch.bfloat16, 16)


def test_auto_on_cpu_keeps_the_cpu_backends() -> None:
    backend = build_backend("auto", "cpu", torch.float32, 64)
    assert not backend.wants_paged_index


def test_dtype_auto_runs_bf16_on_a_gpu_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
                                 "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "num_key_value_heads": 1, "torch_dtype": "float32"})
    with caplog.at_level("WARNING"):
        assert resolve_dtype_name("auto", cfg, "cuda") == "bfloat16"
    assert "--dtype float32 keeps float32" in caplog.text
    assert resolve_dtype_name("float32", cfg, "cuda") == "float32"
    assert resolve_dtype_name("auto", cfg, "cpu") == "float32"


@pytest.mark.parametrize("top", [1, 24, 100, 128, 600])
def test_every_decode_batch_up_to_the_largest_runs_a_graph_less_than_twice_its_size(top: int) -> None:
    sizes = graph_batches(top)
    assert sizes == sorted(set(sizes)) and sizes[-1] == top
    for rows in range(2, top + 1):
        assert next(b for b in sizes if b >= rows) < 2 * rows
