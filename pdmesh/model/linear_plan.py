"""Which product computes a float32 linear layer on CPU, by row count, measured per machine.

A linear layer's product has four implementations here, and which is fastest depends on
the processor and on the row count (a decode step of 1-64 rows streams every weight from
memory; a prefill chunk of hundreds of rows is bound by arithmetic):
- ``KERNEL``, pdmesh's few-row product (``csrc/linear_rows.cpp``, up to ``KERNEL_MAX_ROWS``):
  on AMD processors, where MKL runs its AVX2 code, whole decode steps 1.1-1.7x faster than
  through MKL (docs/performance/log.md, section 12);
- ``MM``, MKL's product computed transposed, ``(weight @ x.T).T`` (up to ``MM_MAX_ROWS``):
  1.2-2.6x ``F.linear``'s few-rows path at 1-256 rows on AMD (section 7);
- ``LINEAR``, ``F.linear`` (MKL's row-major product);
- ``ONEDNN``, oneDNN's product with the weight packed once in its blocked layout: 2.0-2.5x
  MKL's from 8 rows up on an AMD EPYC with AVX-512 (section 15).
On a 2-core Intel Xeon with AVX-512 the order is another again: pdmesh's kernel at one
row, ``F.linear`` at two and three, oneDNN 1.4-1.6x the kernel at 16-31 rows (section 28).
A plan decided for "few rows" as a whole flipped between loads there, since one row and
sixteen rows disagree. So each engine times the products on its own weights when it builds
the model, one range of row counts (``RANGES``) at a time, and logs what it took; nothing
is assumed of a machine. Processes take turns to measure (``pdmesh.measure_lock``): two
workers probing at once on two cores timed every product 50-60x too slow.

Results of different products differ in the last bits (another summation order), as
pdmesh's own kernels' do; greedy tokens stay those of ``transformers`` in the exactness
tests.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pdmesh.cpu import cpu_flags
from pdmesh.measure_lock import measuring_alone
from pdmesh.model import onednn, plan_store
from pdmesh.startup import set_phase

log = logging.getLogger(__name__)

KERNEL_MAX_ROWS = 63
"""Up to this many rows pdmesh's own product (``linear_rows``) can run. Whole decode steps
on AMD machines: 1.1-1.7x faster than with MKL's product at 1 to 31 sequences (section
12). Since its weight vectors stay in registers it also beats oneDNN's at 32 rows on an
AMD EPYC Zen 4 (whole decode steps 1.02-1.07x) and comes within 5% of it at 40-63 (section
44); where another product is faster, the probe gives it the range."""
MM_MAX_ROWS = 256
"""Up to this many rows the transposed product is a choice; prefill chunks above it keep a
row-major output, which the attention and elementwise kernels after it read faster."""


class Product(enum.Enum):
    """One way to compute ``x @ weight.T`` on CPU."""

    KERNEL = "kernel"
    MM = "mm"
    LINEAR = "F.linear"
    ONEDNN = "oneDNN"


RANGES = (1, 2, 4, 8, 16, 32, 48, 64, MM_MAX_ROWS + 1)
"""The first row count of each range a plan decides on its own. Their bounds fall where a
product's reach ends (``KERNEL_MAX_ROWS``, ``MM_MAX_ROWS``), so every product a range may
take serves all of it. 32-63 rows are two ranges: on an AMD EPYC Zen 4 pdmesh's kernel
was 1.02-1.07x oneDNN's in whole decode steps of 32 and 0.95-0.98x at 63, so one range
timed at both ends went either way from load to load (section 44)."""
PROBE_ROWS = ((1,), (2,), (5,), (11,), (23,), (32, 47), (48, 63), (64, 256), (512,))
"""The row counts each range is timed at (their times summed). Up to 31 rows the products'
costs grow smoothly with rows, so a range's geometric middle tells; above they do not: on a
2-core Xeon MKL's products were at their best at 128 rows, where all three tied, while
oneDNN's was 1.14x at 64 and 1.04x at 256 (section 28), so those ranges are timed at both
ends."""
STREAMED_MAX_ROWS = 64
"""Ranges probed at fewer rows than this (decode batches) read the leading
``STREAMED_PROBE_BYTES`` of the weights in model order, from memory as a decode step does;
one weight per shape, in cache, misled: 0.67-1.01x at one row there against whole decode
steps never faster (section 25), and oneDNN 1.2x at 32-63 rows on a Xeon whose decode steps
of 32 ran 6% slower through it (section 28). Ranges above, bound by arithmetic, are timed
on one weight per shape."""
STREAMED_PROBE_BYTES = 512 * 2**20
"""About this many bytes of weights per streamed probe: far past any cache, while the
packed copies the probe makes stay bounded (all of a 7B float32 model's would be 28 GB)."""
DEFAULT_PRODUCTS = (Product.KERNEL,) * 7 + (Product.MM,) + (Product.LINEAR,)
"""Each range's product without a measurement (bfloat16, CUDA, ``PDMESH_ONEDNN=0``)."""
PROBE_TIMING = {"rounds": 3, "reps": 1, "warmup": 1}
"""Each product's best of three passes over the weights, after one: the whole probe of the
default model (eight ranges, three products each) takes ~1.6 s on two cores (the probe of
two regimes it replaced, ~1.5 s); a gain large enough to act on stands out of three."""
SWITCH_MARGIN = 1.05
"""A range leaves its default product only for one at least this much faster: a gain
inside the probe's own spread moves nothing. (Ties near this margin still go either way
from load to load; the processes of one machine share one plan for that:
``plan_store``.)"""
MARGIN = 1.15
"""oneDNN's packed copy of the weights is made only when, for some range, it is at least
this much faster than the best other product: a second copy of the weights is not worth a
gain inside the run-to-run spread. Once made, it serves every range it wins by
``SWITCH_MARGIN``."""


def range_index(rows: int) -> int:
    """Which of ``RANGES`` ``rows`` falls in (an empty input: the first)."""
    return bisect.bisect_right(RANGES, rows) - 1 if rows > 0 else 0


def rows_limit(product: Product) -> float:
    """The most rows ``product`` computes."""
    return {Product.KERNEL: KERNEL_MAX_ROWS, Product.MM: MM_MAX_ROWS}.get(product, float("inf"))


@dataclass(frozen=True, slots=True)
class LinearPlan:
    """The product each of ``RANGES`` takes."""

    products: tuple[Product, ...] = DEFAULT_PRODUCTS

    def __post_init__(self) -> None:
        if len(self.products) != len(RANGES):
            raise ValueError(f"a linear plan names {len(RANGES)} products, one per range; got {len(self.products)}")
        for start, product in zip(RANGES, self.products):
            if rows_limit(product) < start:
                raise ValueError(f"{product.value} cannot compute {start} rows (at most {rows_limit(product)})")

    def product(self, rows: int) -> Product:
        return self.products[range_index(rows)]

    @property
    def packs(self) -> bool:
        """Whether some range runs oneDNN (the weights need its packed copy)."""
        return Product.ONEDNN in self.products

    @property
    def onednn_only(self) -> bool:
        """Whether every range runs oneDNN (the original weights are never read)."""
        return all(p is Product.ONEDNN for p in self.products)

    def describe(self) -> str:
        return ", ".join(f"{_label(i)} {p.value}" for i, p in enumerate(self.products))


ONEDNN_EVERYWHERE = LinearPlan((Product.ONEDNN,) * len(RANGES))


ProductFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(x, weight) -> x @ weight.T`` in any layout."""


def choose(weights: list[torch.Tensor], products: Mapping[Product, ProductFn], always: bool = False,
           share: bool = False) -> LinearPlan:
    """Time each range's candidate products on ``weights``: its default, ``LINEAR`` and
    ``ONEDNN`` (``products`` maps the unpacked ones to their functions; ``KERNEL`` only where
    the CPU kernels have it: else ``MM`` is the few-row default); with ``always``, oneDNN for
    every range without measuring. With ``share``, a plan another process of this machine
    measured on the same shapes and threads within ``plan_store.REUSE_S`` is taken as it
    is, and one measured here is stored for the others."""
    if not onednn.available():
        (log.warning if always else log.info)("this torch build has no oneDNN (mkldnn): the other products are timed")
    elif always:
        log.info("linear products: oneDNN for every row count (PDMESH_ONEDNN=always)")
        return ONEDNN_EVERYWHERE
    weights = [w for w in weights if w.dtype == torch.float32 and w.device.type == "cpu"]
    defaults = _defaults(products)
    if not weights:
        return LinearPlan(defaults)
    extra = [Product.ONEDNN] if onednn.available() else []
    names = [list(dict.fromkeys([d, Product.LINEAR, *extra])) for d in defaults]
    key = _store_key(weights, names, products) if share else None
    set_phase("measuring the linear plan (or waiting for another process's measurement)")
    with measuring_alone("the linear-plan probe"):
        stored = _stored(key) if key else None
        if stored is not None:
            return stored
        timings = _time_ranges(weights, products, names)
        plan = decide(defaults, timings)
        if key:
            plan_store.save(key, tuple(p.value for p in plan.products))
    log.info("linear products on %d thread(s): %s; seconds by range: %s", torch.get_num_threads(), plan.describe(),
             "; ".join(f"{_label(i)}: " + " ".join(f"{p.value} {s * 1e3:.2f} ms" for p, s in t.items())
                       for i, t in enumerate(timings)))
    return plan


def _time_ranges(weights: list[torch.Tensor], products: Mapping[Product, ProductFn],
                 names: list[list[Product]]) -> list[dict[Product, float]]:
    """Each range's seconds by candidate product (``names``), its ``PROBE_ROWS`` summed."""
    streamed = leading_bytes(weights, STREAMED_PROBE_BYTES)
    per_shape: dict[tuple[int, ...], torch.Tensor] = {}
    for w in weights:
        per_shape.setdefault(tuple(w.shape), w)  # the first of a shape: among ``streamed``
    fns = dict(products)
    if any(Product.ONEDNN in n for n in names):
        packed = {id(w): onednn.pack(w) for w in {id(w): w for w in [*streamed, *per_shape.values()]}.values()}
        fns[Product.ONEDNN] = lambda x, w: onednn.product(x, packed[id(w)], None)
    timings = []
    for rows, candidates in zip(PROBE_ROWS, names):
        probed = streamed if rows[0] < STREAMED_MAX_ROWS else list(per_shape.values())
        seconds = [sum(per_rows) for per_rows in zip(*(_seconds([fns[n] for n in candidates], probed, r)
                                                       for r in rows))]
        timings.append(dict(zip(candidates, seconds)))
    return timings


def _stored(key: str) -> LinearPlan | None:
    """The plan another process stored under ``key``, if young enough and still valid."""
    stored = plan_store.load(key)
    if stored is None:
        return None
    try:
        plan = LinearPlan(tuple(Product(p) for p in stored.products))
    except ValueError as exc:  # written by another version of pdmesh, or damaged
        log.warning("the stored linear plan is not one this version can run (%s): measuring instead", exc)
        return None
    log.info("linear products on %d thread(s): %s (measured by process %d %.0fs ago on these shapes and threads)",
             torch.get_num_threads(), plan.describe(), stored.pid, stored.age_s)
    return plan


def _store_key(weights: list[torch.Tensor], candidates: list[list[Product]],
               products: Mapping[Product, ProductFn]) -> str:
    """What a shared plan must have been measured on: the weights' shapes in order, the
    threads, the candidates, the build of each product's code (pdmesh's kernels are a
    module named by a digest of their sources: a plan timed on an older few-row kernel
    must not decide for a newer one), this CPU and this torch."""
    builds = sorted(f"{p.value}:{getattr(fn, '__module__', None)}" for p, fn in products.items())
    what = [[list(w.shape) for w in weights], torch.get_num_threads(), [[p.value for p in c] for c in candidates],
            builds, cpu_flags(), torch.__version__, RANGES, PROBE_ROWS]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def decide(defaults: tuple[Product, ...], timings: list[dict[Product, float]]) -> LinearPlan:
    """The plan from each range's seconds by product: the default unless another product
    without a copy of the weights is ``SWITCH_MARGIN`` faster; oneDNN wherever it beats
    that by ``SWITCH_MARGIN``, if it beats it by ``MARGIN`` somewhere."""
    plain = []
    for default, t in zip(defaults, timings):
        best = min((p for p in t if p is not Product.ONEDNN), key=t.__getitem__)
        plain.append(best if t[best] * SWITCH_MARGIN <= t[default] else default)
    gains = [t[p] / t[Product.ONEDNN] if Product.ONEDNN in t else 0.0 for p, t in zip(plain, timings)]
    if max(gains) < MARGIN:
        return LinearPlan(tuple(plain))
    return LinearPlan(tuple(Product.ONEDNN if g >= SWITCH_MARGIN else p for p, g in zip(plain, gains)))


def _defaults(products: Mapping[Product, ProductFn]) -> tuple[Product, ...]:
    kernel = Product.KERNEL if Product.KERNEL in products else Product.MM
    return tuple(kernel if p is Product.KERNEL else p for p in DEFAULT_PRODUCTS)


def _label(i: int) -> str:
    first = RANGES[i]
    last = RANGES[i + 1] - 1 if i + 1 < len(RANGES) else None
    return f"{first}" if last == first else f"{first}-{last}" if last else f"{first}+"


def _seconds(fns: list[ProductFn], weights: list[torch.Tensor], rows: int) -> list[float]:
    """Seconds of each of ``fns`` over ``weights`` at ``rows`` rows, their rounds alternated."""
    xs = [torch.randn(rows, w.shape[1]) for w in weights]
    return best_seconds_of(*[(lambda f=f: [f(x, w) for x, w in zip(xs, weights)]) for f in fns], **PROBE_TIMING)


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


def best_seconds_of(*fns: Callable[[], object], rounds: int = 5, reps: int = 6, warmup: int = 1) -> list[float]:
    """Seconds per call of each of ``fns``: the best of ``rounds`` of ``reps`` calls after
    ``warmup`` calls, the functions' rounds alternated so that a burst of load on a shared
    machine falls on all of them rather than on whichever ran during it."""
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
