"""Per-request and per-prompt-token prefill cost of the real engine, for the simulator.

A prefill of ``n`` uncached tokens is modelled as ``overhead + n * per_token``; both come
from timing the engine in process on prompts of two lengths (best of three, since this
machine's timings wander), fitted through the two points.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


@dataclass(frozen=True)
class PrefillCosts:
    overhead_s: float
    s_per_token: float
    source: str


def measure(model: str, dtype: str = "float32", short: int = 128, long: int = 1024) -> PrefillCosts:
    engine = LLMEngine.from_model(model, dtype=dtype, enable_prefix_caching=False)
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size

    def best_of_three(n: int) -> float:
        times: list[float] = []
        for _ in range(3):
            ids = [rng.randrange(10, vocab - 10) for _ in range(n)]
            engine.add_request(f"cost-{n}-{len(times)}", ids, SamplingParams(max_tokens=1))
            started = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            times.append(time.perf_counter() - started)
        return min(times)

    best_of_three(64)  # warm-up
    t_short, t_long = best_of_three(short), best_of_three(long)
    per_token = max(1e-7, (t_long - t_short) / (long - short))
    overhead = max(0.0, t_short - short * per_token)
    return PrefillCosts(overhead, per_token, f"measured: {model} ({dtype}), {short} and {long}-token prompts")
