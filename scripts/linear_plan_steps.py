"""Whole decode steps and a lone prompt under three linear plans, alternated in one process
(docs/performance.md, section 28): the plan the engine measured at start-up, and the two
plans the probe it replaced chose between (pdmesh's kernel up to 31 rows then MKL, as
``PDMESH_ONEDNN=0`` runs; and oneDNN for 1-31 rows with the same above, its "few rows"
plan). Decode: ``batch`` sequences of ~300-token contexts, each plan's median of 7 rounds
of 8 steps; prefill: a fresh 512-token prompt, median of 5 per plan.

    .venv/bin/python scripts/linear_plan_steps.py [MODEL_DIR] [--batches 1,2,3,4,8,16,24,32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from pdmesh.bench.profile import run_to_decode
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.model.linear_plan import DEFAULT_PRODUCTS, KERNEL_MAX_ROWS, LinearPlan, Product
from pdmesh.sampling_params import SamplingParams


def plans(measured: LinearPlan) -> dict[str, LinearPlan]:
    few = tuple(Product.ONEDNN if p is Product.KERNEL else p for p in DEFAULT_PRODUCTS)
    return {"measured": measured, "kernel <= %d" % KERNEL_MAX_ROWS: LinearPlan(), "oneDNN <= 31": LinearPlan(few)}


def decode_ms(engine: LLMEngine, batch: int, named: dict[str, LinearPlan]) -> dict[str, float]:
    rng = random.Random(batch)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, output_kind="final_only")
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [rng.randrange(10, vocab - 10) for _ in range(300)], params)
    run_to_decode(engine, warmup=4)
    times: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(7):
        for name, plan in named.items():
            engine.runner.model.apply_linear_plan(plan)
            engine.step()  # untimed: the first step after a switch
            start = time.perf_counter()
            for _ in range(8):
                engine.step()
            times[name].append((time.perf_counter() - start) / 8)
    for i in range(batch):
        engine.abort_request(f"b{batch}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def prefill_ms(engine: LLMEngine, named: dict[str, LinearPlan]) -> dict[str, float]:
    rng = random.Random(7)
    vocab = engine.model_config.vocab_size
    times: dict[str, list[float]] = {name: [] for name in named}
    for i in range(5):
        for name, plan in named.items():
            engine.runner.model.apply_linear_plan(plan)
            engine.add_request(f"p{name}{i}", [rng.randrange(10, vocab - 10) for _ in range(512)],
                               SamplingParams(temperature=0, max_tokens=1))
            start = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=".cache/models/small-llama")
    ap.add_argument("--batches", default="1,2,3,4,8,16,24,32")
    args = ap.parse_args()
    engine = LLMEngine(EngineArgs(model=args.model, dtype="float32", num_blocks=4096).engine_config())
    named = plans(engine.runner.model.plan)
    print(f"measured plan: {named['measured'].describe()}")
    print(f"{'':>22}" + "".join(f"{name:>16}" for name in named) + "   (ms; ratio: the other / measured)")
    for batch in (int(b) for b in args.batches.split(",")):
        ms = decode_ms(engine, batch, named)
        print(f"decode step, batch {batch:>2}" + "".join(f"{v:16.2f}" for v in ms.values())
              + "   " + " ".join(f"{v / ms['measured']:.2f}x" for name, v in ms.items() if name != "measured"))
    ms = prefill_ms(engine, named)
    print(f"{'512-token prefill':>22}" + "".join(f"{v:16.1f}" for v in ms.values())
          + "   " + " ".join(f"{v / ms['measured']:.2f}x" for name, v in ms.items() if name != "measured"))


if __name__ == "__main__":
    main()
