"""pdmesh's few-row linear product (``linear_rows``) against torch's, on every tile shape
and tail it has, and the model wiring that uses it only where it is meant to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdmesh.attention.cpu_kernels import load
from pdmesh.cpu import cpu_flags
from pdmesh.engine.llm import LLM
from pdmesh.model.layers import Linear, few_rows_kernel
from pdmesh.model.linear_plan import KERNEL_MAX_ROWS, MM_MAX_ROWS

KERNELS = load()
AVX2 = {"avx2", "fma"} <= set(cpu_flags().split())
needs_avx2 = pytest.mark.skipif(not AVX2, reason="linear_rows is built only for CPUs with AVX2 and FMA")


def test_the_kernel_exists_exactly_where_the_cpu_has_avx2() -> None:
    assert hasattr(KERNELS, "linear_rows") == AVX2


@needs_avx2
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, 24])
@pytest.mark.parametrize(("k", "n"), [(8, 1), (64, 2), (100, 3), (512, 7), (2048, 50), (13, 4)])
def test_linear_rows_matches_torch(rows: int, k: int, n: int) -> None:
    # Row tiles of 4 with 1-3 left over, column tiles of 3 with 1-2 left, a shared
    # dimension with and without a tail beyond the last 8 lanes.
    torch.manual_seed(rows * 1000 + k + n)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    y = KERNELS.linear_rows(x, w)
    assert y.shape == (rows, n) and y.is_contiguous()
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-5 * k**0.5)


@needs_avx2
def test_linear_rows_reads_strided_rows_in_place_and_copies_other_layouts() -> None:
    torch.manual_seed(0)
    wide, w = torch.randn(6, 96), torch.randn(5, 40)
    torch.testing.assert_close(KERNELS.linear_rows(wide[:, 16:56], w), wide[:, 16:56] @ w.T)
    col_major = torch.randn(40, 6).t()  # what MKL's transposed product hands on
    torch.testing.assert_close(KERNELS.linear_rows(col_major, w), col_major @ w.T)
    with pytest.raises(RuntimeError, match="float32"):
        KERNELS.linear_rows(wide[:, :40].double(), w.double())


@needs_avx2
@pytest.mark.parametrize("rows", [1, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1, MM_MAX_ROWS + 1])
def test_linear_takes_the_kernel_only_for_few_rows(rows: int) -> None:
    torch.manual_seed(rows)
    layer = Linear(64, 48, bias=True)
    x = torch.randn(rows, 64)
    reference = torch.nn.functional.linear(x, layer.weight, layer.bias)
    plain = layer(x)
    layer.few_rows = few_rows_kernel(KERNELS)
    with torch.inference_mode():
        fused = layer(x)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)
    if rows <= KERNEL_MAX_ROWS:
        assert fused.is_contiguous()  # the kernel's row-major output, bias added in place
        assert torch.equal(fused, KERNELS.linear_rows(x, layer.weight) + layer.bias)
    else:
        assert torch.equal(fused, plain)  # MKL's product, as without kernels


def test_the_cpu_backend_gives_every_linear_layer_and_the_lm_head_the_kernels(llama_dir: Path) -> None:
    model = LLM(str(llama_dir), dtype="float32", num_blocks=16, attention_backend="cpu").engine.runner.model
    expected = few_rows_kernel(KERNELS)
    assert (expected is not None) == AVX2  # elsewhere every product stays MKL's
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.few_rows is expected for m in linears)
    assert model.few_rows is expected  # the LM head's product (tied or not) goes through linear() too
