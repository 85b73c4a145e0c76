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
ONE_ROW_PROBE, FEW_ROWS_PROBE, MANY_ROWS_PROBE = 1, 16, 256
"""Row counts timed for the two regimes ``linear`` distinguishes (decode steps and
prefill chunks): up to ``KERNEL_MAX_ROWS`` and above; and one row, a low-load token."""
STREAMED_PROBE_BYTES = 512 * 2**20
"""The few-rows probes read the weights in model order up to about this many bytes: far
past any cache, so they stream from memory as a decode step does, while the packed copies
the probe makes stay a bounded cost at start-up (all of a 7B float32 model's would be
28 GB more)."""
MARGIN = 1.15
"""oneDNN is taken for a regime only when at least this much faster: a second copy of the
weights is not worth a gain inside this machine's run-to-run spread."""
ONE_ROW_FLOOR = 0.95
"""...and for the few-rows regime only when it is also no more than 5% slower at one row
over all the model's weights. On a 2-core AVX2-only EPYC (Zen 3) the 16-row probe went
either way (0.92-1.21x) and took oneDNN for few rows in some loads, while a one-row token
was slower through it: the few-rows regime flipped between loads, and a low-load token's
speed with it (docs/performance.md, section 25). On the AVX-512 EPYC the two were within
4% at one row and oneDNN 2.2x faster at 16 (section 22)."""


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
    """Time ``current(x, weight)`` (the product ``linear`` uses now) against oneDNN's:
    over the leading ``STREAMED_PROBE_BYTES`` of the weights (all of a small model's) at
    ``ONE_ROW_PROBE`` and ``FEW_ROWS_PROBE`` rows, over one weight per shape at
    ``MANY_ROWS_PROBE``; with ``always``, oneDNN for every row count without
    measuring."""
    if not available():
        (log.warning if always else log.info)(
            "this torch build has no oneDNN (mkldnn): linear products stay MKL's / pdmesh's")
        return LinearPlan()
    if always:
        log.info("linear products: oneDNN for every row count (PDMESH_ONEDNN=always)")
        return LinearPlan(few=True, many=True)
    weights = [w for w in weights if w.dtype == torch.float32 and w.device.type == "cpu"]
    if not weights:
        return LinearPlan()
    # A decode step's few rows read every weight once, from memory: probed over one weight
    # per shape (in cache), oneDNN came out 0.67-1.01x at one row and 0.92-1.21x at 16 on
    # the Zen 3 where whole decode steps of 1-32 rows were never faster through it.
    # Prefill's many rows are bound by arithmetic, so one weight per shape tells.
    streamed = leading_bytes(weights, STREAMED_PROBE_BYTES)
    per_shape: dict[tuple[int, ...], torch.Tensor] = {}
    for w in weights:
        per_shape.setdefault(tuple(w.shape), w)  # the first of a shape: among ``streamed``
    probed = {id(w): w for w in [*streamed, *per_shape.values()]}
    packed = {key: pack(w) for key, w in probed.items()}
    few_rows = min(FEW_ROWS_PROBE, max_few_rows)
    one, few = (_gain([(w, packed[id(w)]) for w in streamed], rows, current, rounds=5, reps=2)
                for rows in (ONE_ROW_PROBE, few_rows))
    many = _gain([(w, packed[id(w)]) for w in per_shape.values()], MANY_ROWS_PROBE, current)
    plan = LinearPlan(few=few >= MARGIN and one >= ONE_ROW_FLOOR, many=many >= MARGIN)
    log.info("linear products on %d thread(s): oneDNN packed vs current %.2fx at %d row, %.2fx at %d rows, "
             "%.2fx at %d rows: oneDNN for %s", torch.get_num_threads(), one, ONE_ROW_PROBE, few, few_rows, many,
             MANY_ROWS_PROBE,
             "few and many rows" if plan.few and plan.many else "few rows" if plan.few
             else "many rows" if plan.many else "neither (MKL / pdmesh's kernel kept)")
    return plan


def leading_bytes(weights: list[torch.Tensor], budget: int) -> list[torch.Tensor]:
    """The first of ``weights`` (at least one) up to the one that reaches ``budget`` bytes."""
    taken: list[torch.Tensor] = []
    total = 0
    for w in weights:
        if taken and total >= budget:
            break
        taken.append(w)
        total += w.numel() * w.element_size()
    return taken


def _gain(pairs: list[tuple[torch.Tensor, torch.Tensor]], rows: int, current: Product, **timing: int) -> float:
    """``current``'s time over the (weight, packed weight) ``pairs`` at ``rows`` rows /
    oneDNN's packed product's."""
    xs = [torch.randn(rows, w.shape[1]) for w, _ in pairs]
    ours, theirs = best_seconds_of(lambda: [current(x, w) for x, (w, _) in zip(xs, pairs)],
                                   lambda: [product(x, p, None) for x, (_, p) in zip(xs, pairs)], **timing)
    return ours / theirs


def best_seconds_of(*fns: Callable[[], object], rounds: int = 5, reps: int = 6, warmup: int = 1) -> list[float]:
    """Seconds per call of each of ``fns``: the best of ``rounds`` of ``reps`` calls after
    ``warmup`` calls, the functions' rounds alternated so that a burst of load on a shared
    machine falls on both rather than on whichever ran during it."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / reps)
    return best


def best_seconds(fn: Callable[[], object], rounds: int = 5, reps: int = 6, warmup: int = 1) -> float:
    """Seconds per call of one function: ``best_seconds_of`` for ``fn`` alone."""
    return best_seconds_of(fn, rounds=rounds, reps=reps, warmup=warmup)[0]
