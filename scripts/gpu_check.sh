#!/usr/bin/env bash
# pdmesh's checks on a lent GPU machine, in one call (the device tool runs it from the repo
# root with .gpu carried): the GPU tests, then the GPU engine benchmark (what `pdmesh bench
# engine --device cuda` runs) on an 8B-shaped random Llama. Needs .gpu/ from scripts/gpu_prebuild.sh (flashinfer's wheels and
# its kernels built ahead). Each stage has its own time limit and log in $OUT; the last
# lines of each are printed.
#   device run: bash scripts/gpu_check.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-/tmp/pdmesh-gpu}
site=/tmp/pdmesh-site
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  .gpu/wheels/*.whl || exit 1
mkdir -p "$site/flashinfer/data/aot" && cp -r .gpu/aot/. "$site/flashinfer/data/aot/"
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

stage() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "== $name: rc $rc in $(( $(date +%s) - start )) s"
  tail -n "${TAIL:-30}" "$out/$name.log"
}

stage env 90 bash -c '
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 - <<PY
import torch, flashinfer, transformers
from flashinfer.jit.attention.modules import gen_batch_prefill_module
print("torch", torch.__version__, "cuda", torch.version.cuda, "flashinfer", flashinfer.__version__,
      "transformers", transformers.__version__, torch.cuda.get_device_name())
for hd in (64, 128):
    spec = gen_batch_prefill_module("fa2", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                                    hd, hd, 0, False, False, False)
    print("head_dim", hd, "kernels built ahead:", spec.is_aot)
PY'
if [ "$what" != bench ]; then
  stage tests 240 python3 -m pytest -q -rA tests/gpu --ignore=tests/gpu/test_cuda_mesh.py -p no:cacheprovider -s
fi
if [ "$what" != tests ]; then
  # The entry points themselves, not the `pdmesh` CLI: building its parser imports every
  # service (grpc health, redis ...), which the bare GPU machine lacks.
  [ -f /tmp/llama-8b/config.json ] || stage model 150 python3 -c "from pdmesh.tools.make_tiny import make_tiny
make_tiny('/tmp/llama-8b', 'llama', 'llama-8b', 0, 4_000_000_000, 'cuda')"
  TAIL=20 stage bench 330 python3 -c "import argparse
from pdmesh.bench.gpu_roofline import run_gpu_bench
from pdmesh.config import EngineArgs
args = argparse.Namespace(model='/tmp/llama-8b', quick=False, no_hf=False, out='$out/gpu_engine.json')
run_gpu_bench(args, EngineArgs(model=args.model, device='cuda', dtype='bfloat16', num_blocks=35000,
              max_num_seqs=128, max_num_batched_tokens=16384, max_model_len=4352).engine_config())"
fi
