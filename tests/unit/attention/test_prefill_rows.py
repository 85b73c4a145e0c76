"""The prefill attention's inputs: rows with a contiguous head_dim whatever layout the
linear product before it returned, so torch's CPU flash attention takes them."""

from __future__ import annotations

import torch
from torch.profiler import profile

from pdmesh.attention.torch_backend import _rows


def test_prefill_attention_gets_rows_with_a_contiguous_head_dim_from_a_transposed_product() -> None:
    """Up to 256 rows ``linear`` returns MKL's transposed product; the prefill attention
    must hand SDPA rows whose head_dim is contiguous, or torch leaves its flash kernel for
    the unfused math path (docs/performance/log.md, section 12)."""
    torch.manual_seed(0)
    x, w = torch.randn(40, 64), torch.randn(3 * 8 * 16, 64)
    transposed = torch.mm(w, x.t()).t().view(40, 24, 16)  # what q/k/v views look like
    assert transposed.stride(-1) != 1
    rows = _rows(transposed, 8, 20)
    assert rows.stride(-1) == 1 and torch.equal(rows, transposed[8:28])
    assert _rows(rows, 0, 5).data_ptr() == rows.data_ptr()  # already contiguous: no copy

    def kernels_for(t: torch.Tensor) -> set[str]:
        q = t[:, :8].transpose(0, 1).unsqueeze(0)
        with profile() as prof:
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return {e.key for e in prof.key_averages()}

    assert any("flash_attention" in k for k in kernels_for(rows))
    assert not any("flash_attention" in k for k in kernels_for(transposed[8:28]))  # why _rows copies
