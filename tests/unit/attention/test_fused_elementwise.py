"""The fused CPU norm, rotary and SiLU x up kernels against the torch formulas they replace, on the
layouts the model hands them (row-major prefill rows, transposed decode views), and the
model wiring that turns them on with the CPU attention backend only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdmesh.attention.cpu_kernels import load
from pdmesh.engine.llm import LLM
from pdmesh.model.layers import GatedMLP, RMSNorm, apply_rope, apply_rope_, linear
from pdmesh.model.llama import Attention

KERNELS = load()


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_matches_the_reference(rows: int) -> None:
    torch.manual_seed(rows)
    norm = RMSNorm(512, 1e-6)
    norm.weight.data = torch.randn(512)
    x = torch.randn(rows, 512) * 3
    reference = norm(x)
    norm.kernels = KERNELS
    fused = norm(x)
    torch.testing.assert_close(fused, reference, rtol=1e-6, atol=1e-6)
    # A strided view of rows (a slice of a wider buffer) is read in place.
    wide = torch.randn(rows, 1024)
    torch.testing.assert_close(norm(wide[:, 256:768]), _torch(norm)(wide[:, 256:768]),
                               rtol=1e-6, atol=1e-6)


def _torch(norm: RMSNorm) -> RMSNorm:
    """The same norm without kernels."""
    plain = RMSNorm(norm.weight.numel(), norm.eps)
    plain.weight.data = norm.weight.data
    return plain


@pytest.mark.parametrize("tokens", [3, 300])
def test_rope_in_place_matches_the_reference_on_the_models_layouts(tokens: int) -> None:
    torch.manual_seed(tokens)
    heads, dim = 8, 64
    angles = torch.randn(tokens, dim // 2) * 10
    cos = torch.cat([angles.cos()] * 2, -1).unsqueeze(1)
    sin = torch.cat([angles.sin()] * 2, -1).unsqueeze(1)
    # The q slice of a fused qkv projection: transposed for few rows, row-major for many.
    qkv = linear(torch.randn(tokens, 128), torch.randn(heads * dim + 256, 128))
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    reference = apply_rope(q.clone(), cos, sin)
    out = apply_rope_(KERNELS, q, cos, sin)
    assert out.data_ptr() == q.data_ptr()  # in place
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-5)
    assert torch.equal(apply_rope_(None, reference, cos, sin), apply_rope(reference, cos, sin))


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_the_cpu_backend_turns_the_kernels_on_in_every_norm_attention_and_mlp(llama_dir: Path, backend: str) -> None:
    model = LLM(str(llama_dir), dtype="float32", num_blocks=16, attention_backend=backend).engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, (RMSNorm, Attention, GatedMLP))]
    assert len(layers) == 4 * model.cfg.num_layers + 1  # two norms, attention, MLP per layer; final norm
    assert all(m.kernels is (KERNELS if backend == "cpu" else None) for m in layers)


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_silu_times_up_matches_the_reference_in_place(rows: int) -> None:
    # Transposed products for few rows, row-major for many; lengths that leave a scalar tail.
    torch.manual_seed(rows)
    x, wg, wu = torch.randn(rows, 64), torch.randn(203, 64) * 0.3, torch.randn(203, 64) * 0.3
    gate, up = linear(x, wg), linear(x, wu)
    reference = torch.nn.functional.silu(gate) * up
    ptr = gate.data_ptr()
    KERNELS.silu_mul_(gate, up)
    assert gate.data_ptr() == ptr
    torch.testing.assert_close(gate, reference, rtol=2e-6, atol=1e-6)
    # Large |x|: e^-x saturates without inf or NaN, as torch's silu does.
    big = torch.tensor([[-200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0, 1e-30]])
    ones = torch.ones_like(big)
    expected = torch.nn.functional.silu(big)
    KERNELS.silu_mul_(big, ones)
    torch.testing.assert_close(big, expected, rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_silu_times_up_from_one_products_halves_matches_the_reference(rows: int) -> None:
    # A row of 2 x 203 (a scalar tail in each half), read from a wider buffer's rows, and
    # a work split (4096 elements) that falls inside rows at 300.
    torch.manual_seed(rows)
    wide = torch.randn(rows, 2 * 203 + 10) * 3
    both = wide[:, 4 : 4 + 2 * 203]
    gate, up = both[:, :203], both[:, 203:]
    got = KERNELS.silu_mul_halves(both)
    assert got.is_contiguous() and got.shape == (rows, 203)
    torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, rtol=2e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        KERNELS.silu_mul_halves(both.t())


def test_silu_times_up_refuses_mismatched_layouts() -> None:
    gate, up = torch.randn(4, 8), torch.randn(8, 4).t()
    with pytest.raises(RuntimeError, match="share shape and dense strides"):
        KERNELS.silu_mul_(gate, up)


def test_the_mlp_gives_the_same_result_with_and_without_kernels() -> None:
    torch.manual_seed(0)
    mlp = GatedMLP(64, 160, bias=False)
    for rows in (3, 300):
        x = torch.randn(rows, 64)
        mlp.kernels = None
        reference = mlp(x)
        mlp.kernels = KERNELS
        torch.testing.assert_close(mlp(x), reference, rtol=1e-5, atol=1e-6)
