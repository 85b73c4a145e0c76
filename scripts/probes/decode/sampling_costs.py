"""What sampling costs per decode step, in process (docs/performance/log.md §20).

    .venv/bin/python scripts/probes/decode/sampling_costs.py filter            # top-p over synthetic rows
    .venv/bin/python scripts/probes/decode/sampling_costs.py engine --temperature 0.1 --top-p 0.95

``filter``: ``filter_logits`` (heads, then a sort where needed) against ``filter_logits_sorted`` (the
whole row sorted) on 32 rows of 8,192 and of 128,256 logits, from peaked to near-uniform,
with how many tokens each row's nucleus holds. ``engine``: ``--batch`` requests of 300
random tokens decoding on the default model; the median step, the median forward pass
(the model's call) and the rest (preparing the step, sampling, finishing). Only public
engine calls, so a worktree of an older commit runs it too:
``(cd OLD && PYTHONPATH=. /path/to/.venv/bin/python /path/to/scripts/probes/decode/sampling_costs.py engine ...)``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch


def _ms(fn: Callable[[], object], n: int = 20) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e3


def filter_costs(top_p: float) -> None:
    from pdmesh.engine.nucleus import filter_logits, filter_logits_sorted
    from pdmesh.sampling_params import SamplingParams

    params = [SamplingParams(temperature=0.8, top_p=top_p)] * 32
    gen = torch.Generator().manual_seed(0)
    for vocab in (8192, 128256):
        for scale in (8.0, 3.0, 0.05):
            logits = torch.randn(32, vocab, generator=gen) * scale
            cum = torch.softmax(logits, -1).sort(-1, descending=True).values.cumsum(-1)
            nucleus = int((cum < top_p).sum(-1).float().median()) + 1
            print(f"vocab {vocab}, logits x {scale} ({nucleus} tokens in the nucleus, median): "
                  f"heads {_ms(lambda: filter_logits(logits.clone(), params)):.3f} ms, "
                  f"whole rows sorted {_ms(lambda: filter_logits_sorted(logits.clone(), params)):.3f} ms")


def engine_costs(model: str, batch: int, temperature: float, top_p: float, repetition: float,
                 presence: float) -> None:
    from pdmesh.bench.profile import decode_step_times, run_to_decode
    from pdmesh.config import EngineArgs
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.sampling_params import SamplingParams

    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096).engine_config())
    forward, inner = [], engine.runner.model.forward

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        forward.append(time.perf_counter() - start)
        return out

    engine.runner.model.forward = timed
    rng = random.Random(0)
    params = SamplingParams(temperature=temperature, top_p=top_p, repetition_penalty=repetition,
                            presence_penalty=presence, max_tokens=400, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"d{i}", [rng.randrange(10, 900) for _ in range(300)], params)
    run_to_decode(engine, warmup=20)
    forward.clear()
    steps = decode_step_times(engine, 200)
    step, fwd = statistics.median(steps) * 1e3, statistics.median(forward) * 1e3
    print(f"batch {batch}, temperature {temperature}, top_p {top_p}, repetition_penalty {repetition}, "
          f"presence_penalty {presence}: step {step:.2f} ms, "
          f"forward {fwd:.2f} ms, rest {step - fwd:.2f} ms (medians of 200 steps)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["filter", "engine"])
    p.add_argument("--model", default=".cache/models/small-llama")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    args = p.parse_args()
    if args.part == "filter":
        filter_costs(args.top_p)
    else:
        engine_costs(args.model, args.batch, args.temperature, args.top_p, args.repetition_penalty,
                     args.presence_penalty)


if __name__ == "__main__":
    main()
