"""What a served decode step spends outside its forward pass, against the same engine in
process: the time between one step's forward and the next, from step logs
(``PDMESH_STEP_LOG``, ``pdmesh/engine/step_log.py``).

    PDMESH_STEP_LOG=/tmp/steps/s .venv/bin/python -m pdmesh bench serve \\
        --model .cache/models/small-llama --target pdmesh:0+1 --rate inf --rounds 1 \\
        --workload prefix --prefix-len 512 --input-len 64 --groups 4 --num-requests 32 --output-len 64
    .venv/bin/python scripts/probes/decode/step_log_gaps.py /tmp/steps/s.*
    .venv/bin/python scripts/probes/decode/step_log_gaps.py --in-process .cache/models/small-llama

A file's summary covers its decode-only steps at its largest decode batch: how many, their
forward pass p50 and the gap p50 before each (from the end of the previous step's forward
to this one's start: sampling, rendering, scheduling and, in a worker, whatever holds the
engine thread up). ``--in-process`` runs the serve command's shape in one engine here
(4 prefixes of 512 tokens, 8 prompts of 64 more on each, 64 tokens out, delta outputs as a
worker streams them; two bursts), logs its steps and summarizes them. docs/performance/log.md
section 40.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
from pathlib import Path

from pdmesh.engine.step_log import read_steps


def summary(path: Path) -> str:
    steps = read_steps(path)
    batch = max((s.decode_rows for s in steps if not s.prompt_tokens), default=0)
    forwards, gaps = [], []
    for before, step in zip(steps, steps[1:]):
        if not step.prompt_tokens and step.decode_rows == batch:
            forwards.append(step.forward_s * 1e3)
            gaps.append((step.start_s - before.start_s - before.forward_s) * 1e3)
    if not gaps:
        return f"{path}: no decode-only steps"
    return (f"{path}: {len(gaps)} decode-only steps of {batch} rows: forward p50 "
            f"{statistics.median(forwards):.1f} ms, gap before p50 {statistics.median(gaps):.2f} ms")


def in_process(model: str) -> Path:
    log_dir = Path(tempfile.mkdtemp(prefix="pdmesh-steps-"))
    os.environ["PDMESH_STEP_LOG"] = str(log_dir / "s")
    from pdmesh.config import EngineArgs
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.sampling_params import SamplingParams

    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096).engine_config())
    rng = random.Random(0)
    prefixes = [[rng.randrange(10, 1000) for _ in range(512)] for _ in range(4)]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True, output_kind="delta")
    for burst in range(2):
        for i in range(32):
            engine.add_request(f"b{burst}-{i}", prefixes[i % 4] + [rng.randrange(10, 1000) for _ in range(64)], params)
        while engine.has_unfinished_requests():
            engine.step()
    return next(log_dir.iterdir())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="*", type=Path, help="step logs (FILE.PID)")
    ap.add_argument("--in-process", metavar="MODEL", help="run the served shape in process and summarize it")
    args = ap.parse_args()
    for path in [*args.logs, *([in_process(args.in_process)] if args.in_process else [])]:
        print(summary(path))


if __name__ == "__main__":
    main()
