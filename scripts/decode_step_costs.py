"""Where a served decode step's time goes, and what the page faults of a served run cost.

    .venv/bin/python scripts/decode_step_costs.py [MODEL]        # default .cache/models/small-llama
    PDMESH_KEEP_FREED_MEMORY=0 .venv/bin/python scripts/decode_step_costs.py   # glibc defaults

Part 1 runs the served shape in process (32 requests of 256 random tokens + 64 greedy,
all arriving at once, three rounds) and prints each round's time and minor page faults.
Part 2 decodes 32 sequences with ~260-300-token contexts and profiles 40 steps: the
median step and the ten calls with the most time of their own (cProfile: a C++
kernel or torch op counts whole).
Figures from these runs are in docs/performance.md, section 10.
"""

from __future__ import annotations

import cProfile
import pstats
import random
import resource
import sys
import time

from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(n)]


def main(model: str) -> None:
    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096).engine_config())
    print(engine.allocator.detail if engine.allocator else "allocator: not a CPU engine")
    vocab, rng = engine.model_config.vocab_size, random.Random(0)
    final = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, output_kind="final_only")
    for r in range(3):
        for i, p in enumerate(prompts(rng, 32, 256, vocab)):
            engine.add_request(f"r{r}-{i}", p, final)
        start, faults = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        while engine.has_unfinished_requests():
            engine.step()
        engine.pool.reset_prefix_cache()
        print(f"served shape, round {r}: {time.perf_counter() - start:.2f} s, "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults} minor page faults")

    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i, p in enumerate(prompts(rng, 32, 256, vocab)):
        engine.add_request(f"d{i}", p, long)
    for _ in range(6):  # the prefill steps, then decode only
        engine.step()
    steps = []
    for _ in range(20):
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(40):
        engine.step()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    by_name = {func[2]: (calls, tottime) for func, (_, calls, tottime, _, _) in stats.items()}
    print(f"decode step, batch 32: median {sorted(steps)[10] * 1e3:.1f} ms; the calls that take most:")
    for name, (calls, total) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:10]:
        print(f"  {name}: {total / 40 * 1e3:.2f} ms per step ({calls // 40} calls)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".cache/models/small-llama")
