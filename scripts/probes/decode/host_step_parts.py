"""Where an engine step's host time goes at a large decode batch, on the CPU alone.

On a GPU the host's share of a decode step is time the GPU waits (docs/performance/log.md
sections 48-49). This runs the engine on a CPU with a small model and times each part
of ``LLMEngine.step`` once every sequence decodes: scheduling, the runner's ``prepare``
(the step's tensors and attention tables), the forward, and ``_finish_step`` (sampling,
detokenizing, stop checks, rendering outputs).
Usage: .venv/bin/python scripts/probes/decode/host_step_parts.py MODEL [--rows 64] [--context 1024]
(MODEL: e.g. ``pdmesh model make-tiny /tmp/tiny-llama`` for the host parts alone).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics

from pdmesh.bench.stats import around_calls, wall_seconds_into
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="Hugging Face model folder")
    ap.add_argument("--rows", type=int, default=64, help="sequences decoding together (default: 64)")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens each (default: 1024)")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps (default: 64)")
    args = ap.parse_args()
    engine = LLMEngine(EngineArgs(model=args.model, dtype="float32", num_blocks=args.rows * (args.context // 16 + 16),
                                  max_num_seqs=args.rows, max_num_batched_tokens=16384,
                                  max_model_len=args.context + args.steps + 64).engine_config())
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=args.steps + 32, ignore_eos=True, output_kind="delta")
    for i in range(args.rows):
        engine.add_request(f"r{i}", [rng.randrange(10, 1000) for _ in range(args.context)], params)
    started: set[str] = set()
    while len(started) < args.rows:
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    parts: dict[str, list[float]] = {k: [] for k in ("schedule", "prepare", "forward", "finish")}
    steps: list[float] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(around_calls(engine, "step", wall_seconds_into(steps)))
        for obj, name, key in ((engine.scheduler, "schedule", "schedule"), (engine.runner, "prepare", "prepare"),
                               (engine.runner, "forward", "forward"), (engine, "_finish_step", "finish")):
            stack.enter_context(around_calls(obj, name, wall_seconds_into(parts[key])))
        for _ in range(args.steps):
            engine.step()
    print(f"{args.rows} rows x {args.context} tokens, {type(engine.runner.backend).__name__}, "
          f"median of {args.steps} steps: step {statistics.median(steps) * 1e3:.2f} ms")
    for name, values in parts.items():
        print(f"  {name}: {statistics.median(values) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
