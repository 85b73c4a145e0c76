"""Whole decode steps and lone prompts under several linear plans, alternated in one
process (docs/performance/log.md, section 28): the plan the engine measured at start-up, and
the two plans the probe it replaced chose between (pdmesh's kernel up to
``KERNEL_MAX_ROWS`` rows then MKL, as ``PDMESH_ONEDNN=0`` runs; and oneDNN for those rows
with the same above, its "few rows" plan); or, with ``--vary N``, the measured plan with
the range that starts at N rows computed by each product that can. Decode: ``batch`` sequences of ~300-token contexts, each
plan's median of 7 rounds of 8 steps; prefill: fresh prompts, median of 5 per plan.

    .venv/bin/python scripts/probes/decode/linear_plan_steps.py [MODEL_DIR] [--batches 1,2,3,4,8,16,24,32]
        [--prefill 512] [--vary 64]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import statistics
import time
from collections.abc import Callable

from pdmesh.bench.profile import decode_step_times
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.errors import UnknownRequestError
from pdmesh.model.linear_plan import DEFAULT_PRODUCTS, KERNEL_MAX_ROWS, RANGES, LinearPlan, Product, rows_limit
from pdmesh.sampling_params import SamplingParams


def plans(measured: LinearPlan, vary: int | None) -> dict[str, LinearPlan]:
    if vary is None:
        few = tuple(Product.ONEDNN if p is Product.KERNEL else p for p in DEFAULT_PRODUCTS)
        return {"measured": measured, f"kernel <= {KERNEL_MAX_ROWS}": LinearPlan(),
                f"oneDNN <= {KERNEL_MAX_ROWS}": LinearPlan(few)}
    i = RANGES.index(vary)
    named = {"measured": measured}
    for product in Product:
        if rows_limit(product) >= (RANGES[i + 1] - 1 if i + 1 < len(RANGES) else float("inf")):
            named[f"{vary}+: {product.value}"] = LinearPlan(measured.products[:i] + (product,) + measured.products[i + 1:])
    return named


Setup = Callable[[], object]
"""What one side of an A/B sets on the engine before its round (a linear plan, kernels)."""


def plan_setups(engine: LLMEngine, named: dict[str, LinearPlan]) -> dict[str, Setup]:
    """Each plan as a side: the engine's model computing by it."""
    return {name: functools.partial(engine.runner.model.apply_linear_plan, plan) for name, plan in named.items()}


def decode_ms(engine: LLMEngine, batch: int, sides: dict[str, Setup]) -> dict[str, float]:
    """Median ms of a decode step over ``batch`` ~300-token contexts for each side, their
    rounds alternated (also ``scripts/probes/decode/decode_step_ab.py``'s measure)."""
    rng = random.Random(batch)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, output_kind="final_only")
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [rng.randrange(10, vocab - 10) for _ in range(300)], params)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(7):
        for name, setup in sides.items():
            setup()
            times[name].append(statistics.mean(decode_step_times(engine, 8, warmup=1)))  # after a switch
    for i in range(batch):
        with contextlib.suppress(UnknownRequestError):  # a short context may have ended it
            engine.abort_request(f"b{batch}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def prefill_ms(engine: LLMEngine, sides: dict[str, Setup], tokens: int) -> dict[str, float]:
    rng = random.Random(tokens)
    vocab = engine.model_config.vocab_size
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(5):
        for name, setup in sides.items():
            setup()
            engine.add_request(f"p{name}{tokens}-{i}", [rng.randrange(10, vocab - 10) for _ in range(tokens)],
                               SamplingParams(temperature=0, max_tokens=1))
            start = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=".cache/models/small-llama")
    ap.add_argument("--batches", default="1,2,3,4,8,16,24,32", help="decode batch sizes ('' for none)")
    ap.add_argument("--prefill", default="512", help="prompt lengths of the lone prefills ('' for none)")
    ap.add_argument("--vary", type=int, default=None, choices=RANGES,
                    help="compare the products for the range that starts at this many rows instead")
    args = ap.parse_args()
    engine = LLMEngine(EngineArgs(model=args.model, dtype="float32", num_blocks=4096).engine_config())
    named = plans(engine.runner.model.plan, args.vary)
    print(f"measured plan: {named['measured'].describe()}")
    print(f"{'':>22}" + "".join(f"{name:>16}" for name in named) + "   (ms; ratio: the other / measured)")
    for label, ms in _rows(engine, named, args):
        print(f"{label:>22}" + "".join(f"{v:16.2f}" for v in ms.values())
              + "   " + " ".join(f"{v / ms['measured']:.2f}x" for name, v in ms.items() if name != "measured"))


def _rows(engine: LLMEngine, named: dict[str, LinearPlan], args: argparse.Namespace):  # type: ignore[no-untyped-def]
    sides = plan_setups(engine, named)
    for batch in (int(b) for b in args.batches.split(",") if b):
        yield f"decode step, batch {batch}", decode_ms(engine, batch, sides)
    for tokens in (int(t) for t in args.prefill.split(",") if t):
        yield f"{tokens}-token prefill", prefill_ms(engine, sides, tokens)


if __name__ == "__main__":
    main()
