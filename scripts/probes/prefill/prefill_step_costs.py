"""Where a prefill's time goes, op by op: 32 prompts of 512 random tokens through the engine
(one token out each, as the prefill worker computes them), after a warm-up round, under
cProfile. A C++ kernel or torch op counts whole; ``torch._C._nn.linear`` and oneDNN's calls
are the linear products, ``paged_prefill_`` the attention. docs/performance/log.md, section 36.

    .venv/bin/python scripts/probes/prefill/prefill_step_costs.py [MODEL]   # default .cache/models/small-llama
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random

from pdmesh.bench.engine import _prompts, _run_engine
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine

PROMPTS, PROMPT_LEN = 32, 512


def main(model: str) -> None:
    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096).engine_config())
    vocab, rng = engine.model_config.vocab_size, random.Random(0)
    _run_engine(engine, _prompts(PROMPTS, PROMPT_LEN, rng, vocab), 1)  # warm-up
    engine.pool.reset_prefix_cache()
    prompts = _prompts(PROMPTS, PROMPT_LEN, rng, vocab)
    profile = cProfile.Profile()
    profile.enable()
    seconds = _run_engine(engine, prompts, 1)["seconds"]
    profile.disable()
    print(f"prefill {PROMPTS} x {PROMPT_LEN}: {seconds:.2f} s ({PROMPTS * PROMPT_LEN / seconds:.0f} tok/s)")
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=".cache/models/small-llama", help="a model folder")
    main(parser.parse_args().model)
