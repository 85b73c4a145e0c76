"""The oneDNN probe an engine runs at start-up (``pdmesh.model.onednn.choose``), run
``N`` times over the default model's weights: one log line each, with the measured gains
and the plan taken. Shows whether a machine's choice is stable from load to load.

    .venv/bin/python scripts/onednn_probe.py [N] [MODEL_DIR]

docs/performance.md, section 25.
"""

from __future__ import annotations

import logging
import os
import sys

os.environ["PDMESH_ONEDNN"] = "0"  # the engine loads without a plan; the probe runs below

from pdmesh.config import EngineArgs  # noqa: E402
from pdmesh.engine.llm_engine import LLMEngine  # noqa: E402
from pdmesh.model import onednn  # noqa: E402


def main(times: int, model_dir: str) -> None:
    engine = LLMEngine(EngineArgs(model=model_dir, dtype="float32", num_blocks=256).engine_config())
    logging.getLogger(onednn.__name__).setLevel(logging.INFO)
    for _ in range(times):
        engine.runner.model.choose_onednn()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6, sys.argv[2] if len(sys.argv) > 2 else ".cache/models/small-llama")
