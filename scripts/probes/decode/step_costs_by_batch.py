"""A decode step's median at 1, 2, 4 and 32 sequences and a lone prompt's prefill, in process.

Decode: sequences of one of four shared 512-token prefixes plus 64 tokens of their own
(the shared-prefix serving shape), 120 steps timed after 10. Prefill: fresh 512-token
prompts one at a time, median of 12. For A/B runs of two commits, check the other out in
a worktree and run this there, alternating (docs/performance/log.md, section 23):

    .venv/bin/python scripts/probes/decode/step_costs_by_batch.py [MODEL_DIR]
    git worktree add /tmp/old COMMIT && ln -s "$PWD/.cache" /tmp/old/.cache
    (cd /tmp/old && PYTHONPATH=/tmp/old "$OLDPWD/.venv/bin/python" scripts/probes/decode/step_costs_by_batch.py)
"""

from __future__ import annotations

import argparse
import random
import time

from pdmesh.bench.profile import decode_step_times
from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def main(model: str) -> None:
    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096).engine_config())
    vocab = engine.model_config.vocab_size
    out = []
    for batch in (1, 2, 4, 32):
        rng = random.Random(batch)
        prefixes = [[rng.randrange(10, vocab - 10) for _ in range(512)] for _ in range(4)]
        for i in range(batch):
            own = [rng.randrange(10, vocab - 10) for _ in range(64)]
            engine.add_request(f"b{batch}-{i}", prefixes[i % 4] + own,
                               SamplingParams(temperature=0, max_tokens=150, ignore_eos=True))
        steps = decode_step_times(engine, 120, warmup=10)
        out.append(f"batch {batch} {sorted(steps)[60] * 1e3:.2f} ms")
        while engine.has_unfinished_requests():
            engine.step()
    rng, prefills = random.Random(7), []
    for i in range(12):
        engine.add_request(f"p{i}", [rng.randrange(10, vocab - 10) for _ in range(512)],
                           SamplingParams(temperature=0, max_tokens=1))
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        prefills.append(time.perf_counter() - start)
    out.append(f"512-token prefill {sorted(prefills)[6] * 1e3:.1f} ms")
    print(" | ".join(out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=".cache/models/small-llama", help="a model folder")
    main(parser.parse_args().model)
