"""Whole decode steps of one engine with another source tree's CPU kernels against this
tree's, alternated in one process (docs/performance.md, section 44).

Kernel A/Bs (``decode_attention_ab.py``, the products in ``linear_rows_costs.py``) time a
kernel alone; this times what a served step pays. The engine is built once; each round
switches its kernels module (``use_kernels``: norms, rotary embedding, SiLU x up and the
few-row product; decode attention stays the engine's backend) and runs decode steps over
``batch`` sequences of ~288-token contexts, the few-row kernel computing every row count
it can reach on both sides. Where the kernel can take a batch, oneDNN's product for that
batch's range is a third side: what the plan would serve if the probe chose it.

    git worktree add /tmp/old COMMIT
    .venv/bin/python scripts/decode_step_ab.py /tmp/old [--batches 8,16,24,32,48]
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from pdmesh.attention.cpu_kernels import build_tree, load
from pdmesh.bench.profile import decode_step_times
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.model.linear_plan import RANGES, LinearPlan, Product, rows_limit
from pdmesh.sampling_params import SamplingParams

CONTEXT = 288
ROUNDS = 7
STEPS = 6


def kernel_wherever_it_reaches(plan: LinearPlan) -> LinearPlan:
    """``plan`` with the few-row kernel in every range it can serve whole, so both sides'
    kernels compute the same row counts whatever the probe chose on this load."""
    reach = rows_limit(Product.KERNEL)
    return LinearPlan(tuple(Product.KERNEL if i + 1 < len(RANGES) and RANGES[i + 1] - 1 <= reach else p
                            for i, p in enumerate(plan.products)))


def onednn_at(plan: LinearPlan, rows: int) -> LinearPlan:
    """``plan`` with oneDNN's product for the range ``rows`` falls in."""
    i = RANGES.index(max(r for r in RANGES if r <= rows))
    return LinearPlan(plan.products[:i] + (Product.ONEDNN,) + plan.products[i + 1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="a source tree whose pdmesh/attention/csrc is built as the old side")
    ap.add_argument("--model", default=".cache/models/small-llama")
    ap.add_argument("--batches", default="8,16,24,32,48")
    args = ap.parse_args()
    old, new = build_tree(Path(args.old) / "pdmesh" / "attention" / "csrc"), load()
    engine = LLMEngine(EngineArgs(model=args.model, dtype="float32", num_blocks=4096).engine_config())
    model = engine.runner.model
    print(f"measured plan: {model.plan.describe()}; {CONTEXT}-token contexts, median of {ROUNDS} rounds, ms per step")
    kernel = kernel_wherever_it_reaches(model.plan)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, output_kind="final_only")
    for batch in (int(b) for b in args.batches.split(",")):
        rng = random.Random(batch)
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for rid in ids:
            engine.add_request(rid, [rng.randrange(10, vocab - 10) for _ in range(CONTEXT)], params)
        sides = {"old": (old, kernel), "new": (new, kernel)}
        if batch <= rows_limit(Product.KERNEL):
            sides["oneDNN"] = (new, onednn_at(kernel, batch))
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(ROUNDS):
            for name, (kernels, plan) in sides.items():
                model.use_kernels(kernels)
                model.apply_linear_plan(plan)
                times[name].append(1e3 * statistics.mean(decode_step_times(engine, STEPS, warmup=1)))
        ms = {name: statistics.median(t) for name, t in times.items()}
        print(f"batch {batch:3d}: " + "  ".join(f"{name} {v:6.2f}" for name, v in ms.items())
              + "   " + "  ".join(f"{name} / new {v / ms['new']:.3f}x" for name, v in ms.items() if name != "new"),
              flush=True)
        for rid in ids:
            engine.abort_request(rid)
        while engine.has_unfinished_requests():
            engine.step()


if __name__ == "__main__":
    main()
