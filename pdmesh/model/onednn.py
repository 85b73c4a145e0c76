"""oneDNN's packed-weight product for float32 linear layers on CPU.

torch's CPU build sends ``F.linear`` to MKL, which on AMD processors runs its AVX2 code
even where the CPU has AVX-512: on a 2-core AMD EPYC with AVX-512 the model's shapes ran
at ~200 GFLOP/s through MKL and at 400-540 through oneDNN with weights packed once
(``torch.ops.mkldnn._reorder_linear_weight``, as inductor's CPU freezing and vLLM-CPU
do): 2.0-2.5x from 8 rows up (docs/performance/log.md section 15). Whether and for which row
counts an engine uses it is measured on its own weights (``linear_plan.choose``).
"""

from __future__ import annotations

import torch

PACK_ROWS_HINT = 32
"""The row count oneDNN packs the weight for (its layout; any row count computes)."""


def available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A float32 CPU weight [out, in] copied into oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)


def product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` with the packed weight; ``x`` 2-D float32 on CPU."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
