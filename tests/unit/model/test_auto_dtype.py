"""``dtype="auto"`` never picks bf16 on a CPU that would run it several times slower."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from pdmesh import cpu
from pdmesh.kv import layout
from pdmesh.model.config import ModelConfig


@pytest.fixture()
def bf16_config(llama_dir: Path) -> ModelConfig:
    return replace(ModelConfig.from_dir(llama_dir), torch_dtype="bfloat16")


def test_auto_picks_float32_without_native_bf16(bf16_config, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(layout, "has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert layout.resolve_dtype_name("auto", bf16_config, "cpu") == "float32"
    assert "no native bf16" in caplog.text
    # Asked for explicitly, or on a GPU, bf16 stays bf16.
    assert layout.resolve_dtype_name("bfloat16", bf16_config, "cpu") == "bfloat16"
    assert layout.resolve_dtype_name("auto", bf16_config, "cuda") == "bfloat16"


def test_auto_keeps_bf16_with_native_bf16(bf16_config, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(layout, "has_native_bf16", lambda: True)
    assert layout.resolve_dtype_name("auto", bf16_config, "cpu") == "bfloat16"


def test_native_bf16_is_read_from_the_cpu_flags() -> None:
    assert cpu.has_native_bf16("fpu sse avx2 fma") is False  # an AVX2-only EPYC
    assert cpu.has_native_bf16("avx2 avx512f avx512_bf16") is True
    assert cpu.has_native_bf16("fp asimd bf16") is True  # Arm
