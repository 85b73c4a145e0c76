"""A lone prefill's time with one OpenMP pool in the process against two.

GNU OpenMP keeps a pool of threads per thread that starts parallel regions; with more
pooled threads than cores, waiting threads sleep almost at once and every region pays
for waking them (``pdmesh/engine/compute_thread.py``). Each way runs in a fresh process
(a pool lives as long as its thread) and times 256-token prompts, one token out, one at
a time through ``AsyncLLMEngine`` (steps on its engine thread, as in a worker):

- ``main``: the engine built on the main thread, as workers did before;
- ``passing``: built on a thread that exits first (``build_on_passing_thread``), as now;
- ``in-process``: no engine thread at all, ``LLMEngine.step`` on the main thread (what
  ``pdmesh bench`` compares the mesh with).

    .venv/bin/python scripts/probes/prefill/openmp_pools.py --model .cache/models/small-llama [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time

WAYS = ("main", "passing", "in-process")


def _measure(way: str, model: str, n: int, threads: int) -> float:
    from pdmesh.bench.engine import _run_engine
    from pdmesh.bench.stats import pct
    from pdmesh.engine.async_engine import AsyncLLMEngine
    from pdmesh.engine.compute_thread import build_on_passing_thread
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.sampling_params import SamplingParams

    def build() -> LLMEngine:
        return LLMEngine.from_model(model, dtype="float32", num_blocks=2048, threads=threads)

    engine = build_on_passing_thread(build) if way == "passing" else build()
    rng = random.Random(0)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)

    def prompt() -> list[int]:
        return [rng.randrange(10, 1000) for _ in range(256)]

    async def run() -> list[float]:
        async_engine = AsyncLLMEngine(engine)
        times = []
        for _ in range(n + 2):  # two warm-up prompts
            if way == "in-process":
                times.append(_run_engine(engine, [prompt()], 1)["ttft_p50"])
            else:
                t0 = time.perf_counter()
                async for _out in async_engine.generate(prompt(), one):
                    break
                times.append(time.perf_counter() - t0)
            await asyncio.sleep(0.2)
        await async_engine.shutdown()
        return times[2:]

    return 1000 * pct(asyncio.run(run()), 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=12, help="prompts per way and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one child's way
    args = ap.parse_args()
    if args.way:
        print(f"{_measure(args.way, args.model, args.n, args.threads):.1f}")
        return
    print(f"256-token prompts, 1 token out, {args.threads} threads: TTFT p50 (ms), {args.n} per cell")
    print("round " + "".join(f"{w:>12s}" for w in WAYS))
    for r in range(args.rounds):
        cells = []
        for way in WAYS:
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--n", str(args.n),
                                  "--threads", str(args.threads), "--way", way],
                                 check=True, capture_output=True, text=True, timeout=600)
            cells.append(out.stdout.strip().splitlines()[-1])
        print(f"{r + 1:5d} " + "".join(f"{c:>12s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
