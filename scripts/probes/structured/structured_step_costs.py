"""The sampler's share of a decode step with and without grammar rows: 32 requests in one
engine, free (all unconstrained) against mixed (16 under a 48-digit JSON schema), the
sampler timed around each call. docs/structured-outputs.md keeps the figures.

    .venv/bin/python scripts/probes/structured/structured_step_costs.py .cache/models/small-llama
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pdmesh.engine.sampler as sampler_module
from pdmesh.bench.structured import _run, _schema
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model folder")
    args = parser.parse_args()
    engine = LLMEngine.from_model(args.model, dtype="float32", max_num_seqs=64)
    spec = _schema(48)
    spent = {"s": 0.0, "calls": 0}
    untimed = sampler_module.Sampler.__call__

    def timed(self: Any, logits: Any, seqs: Any) -> Any:
        started = time.perf_counter()
        out = untimed(self, logits, seqs)
        spent["s"] += time.perf_counter() - started
        spent["calls"] += 1
        return out

    sampler_module.Sampler.__call__ = timed  # type: ignore[method-assign]
    for label, constrained in (("free", False), ("mixed", True), ("free", False), ("mixed", True)):
        params = [SamplingParams(temperature=0.8, seed=i, max_tokens=108, output_kind="delta",
                                 ignore_eos=not (constrained and i % 2 == 0),
                                 structured_output=spec if constrained and i % 2 == 0 else None) for i in range(32)]
        spent.update(s=0.0, calls=0)
        started = time.perf_counter()
        _run(engine, params, f"{label}{time.time()}")
        wall = time.perf_counter() - started
        print(f"{label}: wall {wall:.2f}s, sampler {spent['s']:.3f}s over {spent['calls']} calls "
              f"({1e3 * spent['s'] / spent['calls']:.2f} ms/call)")


if __name__ == "__main__":
    main()
