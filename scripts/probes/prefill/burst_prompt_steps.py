"""The prompt phase of a shared-prefix burst in process: what a served worker's prompt
steps would take without the server around them (docs/performance/log.md §29).

A burst of ``--groups`` prefixes of 512 tokens, each followed by 8 prompts of 64 more
(the `pdmesh bench serve --workload prefix` shape), computed by one engine on
``--threads`` threads with ``--budget`` prompt tokens a step, after the worker's warm-up;
prints each step's wall and engine-thread CPU milliseconds, and the phase's prompt tokens
per second. ``--pair`` runs two such processes at once, as the two one-core
workers of a 1 + 1 mesh on 2 cores do.

    .venv/bin/python scripts/probes/prefill/burst_prompt_steps.py --threads 2 --groups 4 --budget 2048
    .venv/bin/python scripts/probes/prefill/burst_prompt_steps.py --threads 1 --groups 2 --budget 1024 --pair
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time

PREFIX, SUFFIX, PER_GROUP = 512, 64, 8


def run(model: str, threads: int, groups: int, budget: int, rounds: int, seed: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.engine.warm_up import warm_up
    from pdmesh.sampling_params import SamplingParams

    engine = LLMEngine.from_model(model, dtype="float32", num_blocks=4096)
    warm_up(engine)
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, output_kind="final_only")
    for r in range(rounds):
        prompts = []
        for _ in range(groups):
            prefix = [rng.randrange(10, 1000) for _ in range(PREFIX)]
            prompts += [prefix + [rng.randrange(10, 1000) for _ in range(SUFFIX)] for _ in range(PER_GROUP)]
        rng.shuffle(prompts)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{r}-{i}", p, params)
        steps, started = [], time.perf_counter()
        while engine.has_unfinished_requests():
            wall, cpu = time.perf_counter(), time.thread_time()
            engine.step(budget)
            steps.append((1000 * (time.perf_counter() - wall), 1000 * (time.thread_time() - cpu)))
        seconds = time.perf_counter() - started
        computed = groups * (PREFIX + PER_GROUP * SUFFIX)
        print(f"threads {threads}, {groups} groups, budget {budget}, round {r}: {seconds:.3f} s, "
              f"{computed / seconds:.0f} prompt tok/s; steps ms (wall/cpu) "
              + " ".join(f"{w:.0f}/{c:.0f}" for w, c in steps), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=".cache/models/small-llama")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pair", action="store_true", help="two processes at once")
    args = ap.parse_args()
    if not args.pair:
        run(args.model, args.threads, args.groups, args.budget, args.rounds, args.seed)
        return
    cmd = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads), "--groups",
           str(args.groups), "--budget", str(args.budget), "--rounds", str(args.rounds)]
    procs = [subprocess.Popen([*cmd, "--seed", str(seed)]) for seed in (1, 2)]
    for p in procs:
        p.wait(600)


if __name__ == "__main__":
    main()
