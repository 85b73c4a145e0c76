"""Whole decode steps of one engine with another source tree's CPU kernels against this
tree's, alternated in one process (docs/performance/log.md, section 44).

Kernel A/Bs (``decode_attention_ab.py``, ``linear_rows_ab.py``) time a kernel alone; this
times what a served step pays. The engine is built once; each round switches its kernels
module (``use_kernels``: norms, rotary embedding, SiLU x up and the few-row product; decode
attention stays the engine's backend) and times decode steps as ``linear_plan_steps.py``
does (``decode_ms``: ``batch`` sequences of ~300-token contexts, median of 7 rounds), the
few-row kernel computing every row count it can reach on both sides. Where the kernel can
take a batch, oneDNN's product for that batch's range is a third side: what the plan would
serve if the probe chose it.

    git worktree add /tmp/old COMMIT
    .venv/bin/python scripts/probes/decode/decode_step_ab.py /tmp/old [--batches 8,16,24,32,48]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

from linear_plan_steps import Setup, decode_ms

from pdmesh.attention.cpu_kernels import build_tree, load
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.model.linear_plan import DEFAULT_PRODUCTS, LinearPlan, Product, range_index, rows_limit


def with_kernel(plan: LinearPlan) -> LinearPlan:
    """``plan`` with the few-row kernel in every range it takes by default (every range it
    can serve), so both sides' kernels compute the same row counts whatever the probe chose
    on this load."""
    return LinearPlan(tuple(d if d is Product.KERNEL else p for d, p in zip(DEFAULT_PRODUCTS, plan.products)))


def with_onednn_at(plan: LinearPlan, rows: int) -> LinearPlan:
    """``plan`` with oneDNN's product for the range ``rows`` falls in."""
    products = list(plan.products)
    products[range_index(rows)] = Product.ONEDNN
    return LinearPlan(tuple(products))


def side(engine: LLMEngine, kernels: ModuleType, plan: LinearPlan) -> Setup:
    def setup() -> None:
        engine.runner.model.use_kernels(kernels)
        engine.runner.model.apply_linear_plan(plan)
    return setup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="a source tree whose pdmesh/attention/csrc is built as the old side")
    ap.add_argument("--model", default=".cache/models/small-llama")
    ap.add_argument("--batches", default="8,16,24,32,48")
    args = ap.parse_args()
    old, new = build_tree(Path(args.old) / "pdmesh" / "attention" / "csrc"), load()
    engine = LLMEngine(EngineArgs(model=args.model, dtype="float32", num_blocks=4096).engine_config())
    print(f"measured plan: {engine.runner.model.plan.describe()}; ms per decode step")
    kernel = with_kernel(engine.runner.model.plan)
    for batch in (int(b) for b in args.batches.split(",")):
        sides = {"old": side(engine, old, kernel), "new": side(engine, new, kernel)}
        if batch <= rows_limit(Product.KERNEL):
            sides["oneDNN"] = side(engine, new, with_onednn_at(kernel, batch))
        ms = decode_ms(engine, batch, sides)
        print(f"batch {batch:3d}: " + "  ".join(f"{name} {v:6.2f}" for name, v in ms.items())
              + "   " + "  ".join(f"{name} / new {v / ms['new']:.3f}x" for name, v in ms.items() if name != "new"),
              flush=True)


if __name__ == "__main__":
    main()
