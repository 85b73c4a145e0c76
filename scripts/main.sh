#!/usr/bin/env bash
# The main job: set up ./.venv, make the default model (a seeded 40M-parameter Llama with a
# BPE tokenizer trained on local text), start the whole mesh on this machine (a private
# redis-server, one prefill and one decode worker, the router) and stream a real request
# through it: router -> prefill -> KV over NIXL -> decode -> back.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
model=${PDMESH_MODEL:-.cache/models/small-llama}
if [ ! -f "$model/config.json" ]; then
  .venv/bin/pdmesh model make-tiny "$model" --arch llama --size small --seed 0
fi
run=$(mktemp -d)
.venv/bin/pdmesh up --model "$model" --prefill 1 --decode 1 --port 0 --http-port 0 --num-blocks 1024 \
  --log-dir "$run/logs" --ready-file "$run/ready" &
up=$!
trap 'kill -TERM "$up" 2>/dev/null || true; wait "$up" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -s "$run/ready" ] && break
  kill -0 "$up" 2>/dev/null || { echo "pdmesh up exited; logs in $run/logs" >&2; exit 1; }
  sleep 0.5
done
[ -s "$run/ready" ] || { echo "the mesh did not become ready; logs in $run/logs" >&2; exit 1; }
prompt=${1:-def fibonacci(n):}
echo "gRPC: router -> prefill -> KV over NIXL -> decode, streamed:"
.venv/bin/pdmesh generate --router "$(cat "$run/ready")" --max-tokens 48 "$prompt"
echo "OpenAI HTTP API (POST $(cat "$run/ready.http")/v1/completions):"
.venv/bin/python - "$(cat "$run/ready.http")" "$prompt" "$model" <<'PY'
import json, sys, urllib.request
url, prompt, model = sys.argv[1:4]
body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=120))
print(repr(out["choices"][0]["text"]), out["usage"])
PY
