"""The engine's linear layer: the same values as ``F.linear`` (to float32 rounding), in a
layout every consumer accepts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pdmesh.model.layers import Linear, linear


@pytest.mark.parametrize("rows", [1, 4, 33, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_f_linear(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    layer = Linear(64, 96, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(96, 64, generator=g))
        if bias:
            layer.bias.copy_(torch.randn(96, generator=g))
    x = torch.randn(rows, 64, generator=g)
    got = layer(x)
    want = F.linear(x, layer.weight, layer.bias)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    # Consumers split the last dimension and view it as heads.
    assert got.split([32, 64], dim=-1)[0].view(rows, 4, 8).shape == (rows, 4, 8)


def test_three_dimensional_inputs_take_f_linear() -> None:
    w = torch.randn(8, 4)
    x = torch.randn(2, 3, 4)
    assert torch.equal(linear(x, w), F.linear(x, w))
