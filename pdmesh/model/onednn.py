"""oneDNN's packed-weight product for float32 linear layers on CPU, where it beats MKL's.

torch's CPU build sends ``F.linear`` to MKL, which on AMD processors runs its AVX2 code
even where the CPU has AVX-512: on a 2-core AMD EPYC with AVX-512 the model's shapes ran
at ~200 GFLOP/s through MKL and at 400-540 through oneDNN with weights packed once
(``torch.ops.mkldnn._reorder_linear_weight``, as inductor's CPU freezing and vLLM-CPU
do): 2.0-2.5x from 8 rows up (docs/performance.md section 15). On an AVX2-only EPYC the
two were within 4% of each other. So each engine measures both on its own weights when
it builds the model and takes oneDNN for a range of rows only where it is clearly faster
(``MARGIN``), logging the figures; the choice is per machine, never assumed.

Results differ from MKL's in the last bits (another summation order), as pdmesh's own
kernels' do; greedy tokens stay those of ``transformers`` in the exactness tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)
PACK_ROWS_HINT = 32
"""The row count oneDNN packs the weight for (its layout; any row count computes)."""
FEW_ROWS_PROBE, MANY_ROWS_PROBE = 16, 256
"""Row counts timed for the two regimes ``linear`` distinguishes (decode steps and
prefill chunks): up to ``KERNEL_MAX_ROWS`` and above."""
MARGIN = 1.15
"""oneDNN is taken for a regime only when at least this much faster: a second copy of the
weights is not worth a gain inside this machine's run-to-run spread."""


@dataclass(frozen=True, slots=True)
class LinearPlan:
    """Which row regimes run oneDNN's product (the rest keep ``linear``'s own paths)."""

    few: bool = False
    many: bool = False

    @property
    def any(self) -> bool:
        return self.few or self.many


def available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A float32 CPU weight [out, in] copied into oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)


def product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` with the packed weight; ``x`` 2-D float32 on CPU."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def choose(weights: list[torch.Tensor], current: Product, max_few_rows: int, always: bool = False) -> LinearPlan:
    """Time ``current(x, weight)`` (the product ``linear`` uses now) against oneDNN's on
    each distinct weight shape, at ``FEW_ROWS_PROBE`` and ``MANY_ROWS_PROBE`` rows; with
    ``always``, oneDNN for every row count without measuring."""
    if not available():
        (log.warning if always else log.info)(
            "this torch build has no oneDNN (mkldnn): linear products stay MKL's / pdmesh's")
        return LinearPlan()
    if always:
        log.info("linear products: oneDNN for every row count (PDMESH_ONEDNN=always)")
        return LinearPlan(few=True, many=True)
    shapes = {tuple(w.shape): w for w in weights if w.dtype == torch.float32 and w.device.type == "cpu"}
    if not shapes:
        return LinearPlan()
    packed = {s: pack(w) for s, w in shapes.items()}
    choice = {}
    for rows in (min(FEW_ROWS_PROBE, max_few_rows), MANY_ROWS_PROBE):
        xs = {s: torch.randn(rows, s[1]) for s in shapes}
        ours = best_seconds(lambda: [current(xs[s], w) for s, w in shapes.items()])
        theirs = best_seconds(lambda: [product(xs[s], packed[s], None) for s in shapes])
        choice[rows] = ours / theirs
    few, many = choice[min(FEW_ROWS_PROBE, max_few_rows)], choice[MANY_ROWS_PROBE]
    plan = LinearPlan(few=few >= MARGIN, many=many >= MARGIN)
    log.info("linear products: oneDNN packed vs current %.2fx at %d rows, %.2fx at %d rows: "
             "oneDNN for %s", few, FEW_ROWS_PROBE, many, MANY_ROWS_PROBE,
             "few and many rows" if plan.few and plan.many else "few rows" if plan.few
             else "many rows" if plan.many else "neither (MKL / pdmesh's kernel kept)")
    return plan


def best_seconds(fn: Callable[[], object], rounds: int = 5, reps: int = 6, warmup: int = 1) -> float:
    """Seconds per call: the best of ``rounds`` of ``reps`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / reps
