"""The sampler's share of a decode step with and without grammar rows: 32 requests in one
engine, free (all unconstrained) against mixed (16 under a 48-digit JSON schema), the
sampler timed around each call. docs/structured-outputs.md keeps the figures.

    .venv/bin/python scripts/structured_step_costs.py .cache/models/small-llama
"""
import sys
import time

import pdmesh.engine.sampler as S
from pdmesh.bench.structured import _run, _schema
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams

eng = LLMEngine.from_model(sys.argv[1], dtype="float32", max_num_seqs=64)
spec = _schema(48)
acc = {"t": 0.0, "n": 0}
orig = S.Sampler.__call__
def timed(self, logits, seqs):
    t = time.perf_counter(); out = orig(self, logits, seqs); acc["t"] += time.perf_counter() - t; acc["n"] += 1; return out
S.Sampler.__call__ = timed
for label, share in (("free", 0), ("mixed", 0.5), ("free", 0), ("mixed", 0.5)):
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=108, ignore_eos=not (share and i % 2 == 0), output_kind="delta",
                             structured_output=spec if share and i % 2 == 0 else None) for i in range(32)]
    acc.update(t=0.0, n=0); t0 = time.perf_counter()
    _run(eng, params, f"{label}{time.time()}")
    wall = time.perf_counter() - t0
    print(f"{label}: wall {wall:.2f}s, sampler {acc['t']:.3f}s over {acc['n']} calls ({1e3*acc['t']/acc['n']:.2f} ms/call)")
