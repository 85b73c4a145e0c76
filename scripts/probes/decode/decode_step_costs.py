"""Where a served decode step's time goes, and what the page faults of a served run cost.

    .venv/bin/python scripts/probes/decode/decode_step_costs.py [MODEL]        # default .cache/models/small-llama
    PDMESH_KEEP_FREED_MEMORY=0 .venv/bin/python scripts/probes/decode/decode_step_costs.py   # glibc defaults
    .venv/bin/python scripts/probes/decode/decode_step_costs.py MODEL --batch 64 --prefix 512 --groups 4 --skip-served

Part 1 runs the served shape in process (``--batch`` requests of the shape below + 64
greedy tokens, all arriving at once, three rounds) and prints each round's time, the
time of its steps with prompt work and its minor page faults, and profiles the last.
Part 2 decodes ``--batch`` sequences (default 32) of 256 random tokens, after a shared
``--prefix`` (default none) of which there are ``--groups`` (the shared-prefix serving
shape: 64 x (512 + 64), 4 groups), and profiles 40 steps: the median step and the ten
calls with the most time of their own (cProfile: a C++ kernel or torch op counts whole).
Figures from these runs are in docs/performance/log.md, section 10.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import resource
import time

from pdmesh.bench.profile import decode_step_times
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(n)]


def main(model: str, batch: int, prefix: int, groups: int, suffix: int, served: bool) -> None:
    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096).engine_config())
    print(engine.allocator.detail if engine.allocator else "allocator: not a CPU engine")
    vocab, rng = engine.model_config.vocab_size, random.Random(0)
    final = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, output_kind="final_only")
    for r in range(3 if served else 0):
        shared = prompts(rng, max(groups, 1), prefix, vocab)
        for i, p in enumerate(prompts(rng, batch, suffix, vocab)):
            engine.add_request(f"r{r}-{i}", shared[i % len(shared)] + p, final)
        start, faults = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        profile = cProfile.Profile() if r == 2 else None
        prefill_s, mixed = 0.0, 0
        if profile:
            profile.enable()
        while engine.has_unfinished_requests():
            t0, prefilling = time.perf_counter(), bool(engine.scheduler.pending_prompt_tokens)
            engine.step()
            if prefilling:
                prefill_s, mixed = prefill_s + time.perf_counter() - t0, mixed + 1
        if profile:
            profile.disable()
        engine.pool.reset_prefix_cache()
        print(f"served shape, round {r}: {time.perf_counter() - start:.2f} s ({mixed} steps with prompt "
              f"work: {prefill_s:.2f} s), {resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults} "
              "minor page faults")
    if served:
        top_calls(profile, 1, "per run")

    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    shared = prompts(rng, max(groups, 1), prefix, vocab)
    for i, p in enumerate(prompts(rng, batch, suffix, vocab)):
        engine.add_request(f"d{i}", shared[i % len(shared)] + p, long)
    steps = decode_step_times(engine, 20)  # the prefill steps first, untimed
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(40):
        engine.step()
    profile.disable()
    print(f"decode step, batch {batch}, contexts {prefix + suffix}-{prefix + suffix + 60}: "
          f"median {sorted(steps)[10] * 1e3:.1f} ms")
    top_calls(profile, 40, "per step")


def top_calls(profile: cProfile.Profile, runs: int, unit: str) -> None:
    """The ten calls with the most time of their own, per run of what was profiled."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    by_name = {func[2]: (calls, tottime) for func, (_, calls, tottime, _, _) in stats.items()}
    print("the calls that take most:")
    for name, (calls, total) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:10]:
        print(f"  {name}: {total / runs * 1e3:.2f} ms {unit} ({calls // runs} calls)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=".cache/models/small-llama")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=0, help="shared prefix tokens (default: none)")
    ap.add_argument("--groups", type=int, default=4, help="distinct shared prefixes (default: 4)")
    ap.add_argument("--suffix", type=int, default=256, help="each sequence's own tokens (default: 256)")
    ap.add_argument("--skip-served", action="store_true", help="part 2 only")
    a = ap.parse_args()
    main(a.model, a.batch, a.prefix, a.groups, a.suffix, not a.skip_served)
