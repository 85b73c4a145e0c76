#!/usr/bin/env bash
# The main job: set up ./.venv, make the default model (a seeded 40M-parameter Llama with a
# BPE tokenizer trained on local text) and stream a real generation from the engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
model=${PDMESH_MODEL:-.cache/models/small-llama}
if [ ! -f "$model/config.json" ]; then
  .venv/bin/pdmesh model make-tiny "$model" --arch llama --size small --seed 0
fi
exec .venv/bin/pdmesh generate --model "$model" --dtype float32 --max-tokens 48 \
  "${1:-def fibonacci(n):}"
