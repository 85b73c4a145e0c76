"""How late a worker's other threads run while its engine thread decodes (docs/performance/log.md §15).

    .venv/bin/python scripts/probes/decode/gil_latency.py --model .cache/models/small-llama [--max-tokens 96]

32 prompts of 256 tokens decode at once through ``AsyncLLMEngine`` (steps on its engine
thread, as in a worker). Meanwhile the event loop sleeps 1 ms over and over (as a loop that
streams tokens and answers RPCs wakes) and a side thread sleeps 0.1 ms over and over (as
the NIXL poller does); each records how much later than asked it ran again. A kernel that
holds the GIL makes both wait for the whole call, or for Python's 5 ms switch interval.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time

from pdmesh.bench.stats import pct
from pdmesh.engine.async_engine import AsyncLLMEngine
from pdmesh.engine.compute_thread import build_on_passing_thread
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def _summary(lateness: list[float]) -> str:
    qs = " / ".join(f"{1000 * pct(lateness, q):.2f}" for q in (0.5, 0.9, 0.99))
    return f"p50 / p90 / p99 {qs} ms, max {1000 * max(lateness):.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = build_on_passing_thread(lambda: LLMEngine.from_model(
        args.model, dtype="float32", num_blocks=2048, threads=args.threads))
    rng = random.Random(0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    loop_late: list[float] = []
    side_late: list[float] = []
    stop = threading.Event()

    def side_thread() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            time.sleep(0.0001)
            side_late.append(time.perf_counter() - t0 - 0.0001)

    async def run() -> float:
        async_engine = AsyncLLMEngine(engine)

        async def one(prompt: list[int]) -> None:
            async for _ in async_engine.generate(prompt, params):
                pass

        async def ticker() -> None:
            while True:
                t0 = time.perf_counter()
                await asyncio.sleep(0.001)
                loop_late.append(time.perf_counter() - t0 - 0.001)

        await one([rng.randrange(10, 1000) for _ in range(16)])  # warm-up
        tick = asyncio.create_task(ticker())
        side = threading.Thread(target=side_thread)
        side.start()
        t0 = time.perf_counter()
        await asyncio.gather(*[one([rng.randrange(10, 1000) for _ in range(256)]) for _ in range(32)])
        wall = time.perf_counter() - t0
        stop.set()
        side.join()
        tick.cancel()
        await async_engine.shutdown()
        return wall

    wall = asyncio.run(run())
    print(f"32 x 256 in + {args.max_tokens} out in {wall:.2f} s")
    print(f"event loop, 1 ms sleeps: {_summary(loop_late)}")
    print(f"side thread, 0.1 ms sleeps: {_summary(side_late)}")


if __name__ == "__main__":
    main()
