"""The linear-plan probe an engine runs at start-up (``pdmesh.model.linear_plan.choose``),
run ``N`` times over the default model's weights: one log line each, with each range's
timings and the plan taken. Shows whether a machine's choice is stable from load to load
(docs/performance/log.md, sections 25 and 28; this was ``scripts/onednn_probe.py``).

    .venv/bin/python scripts/probes/linear/linear_plan_probe.py [N] [MODEL_DIR]
"""

from __future__ import annotations

import argparse
import logging
import os

os.environ["PDMESH_ONEDNN"] = "0"  # the engine loads without a plan; the probe runs below

from pdmesh.config import EngineArgs  # noqa: E402
from pdmesh.engine.llm_engine import LLMEngine  # noqa: E402
from pdmesh.model import linear_plan  # noqa: E402


def main(times: int, model_dir: str) -> None:
    engine = LLMEngine(EngineArgs(model=model_dir, dtype="float32", num_blocks=256).engine_config())
    logging.getLogger(linear_plan.__name__).setLevel(logging.INFO)
    for _ in range(times):
        engine.runner.model.choose_linear_plan(share=False)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("times", nargs="?", type=int, default=6, help="how many probes to run")
    parser.add_argument("model", nargs="?", default=".cache/models/small-llama", help="a model folder")
    args = parser.parse_args()
    main(args.times, args.model)
