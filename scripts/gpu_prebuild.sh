#!/usr/bin/env bash
# Prepare, on a machine without a GPU, what a lent GPU machine needs for pdmesh's GPU
# checks (scripts/gpu_check.sh), into .gpu/ (git-ignored):
#   .gpu/wheels  flashinfer and its one package the GPU image lacks, for Python 3.12;
#   .gpu/aot     flashinfer's batch-prefill kernels (bf16; head_dim 64 and 128; sm_90a),
#                compiled here with NVIDIA's pip-installed nvcc: the H100/H200 then loads
#                them from flashinfer's AOT folder and spends no device time compiling.
# Takes ~4 minutes on 2 cores. Usage: bash scripts/gpu_prebuild.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHINFER=flashinfer-python==0.6.18.post1
TVM_FFI=apache-tvm-ffi==0.1.15.post2
CUDA=13.0
root=$PWD/.gpu
build=$root/build
mkdir -p "$root/wheels" "$root/aot" "$build"

# 1. Wheels for the GPU machine (its python3 is 3.12 and has torch, ninja, nvidia-ml-py).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
  -d "$root/wheels" "$FLASHINFER" "$TVM_FFI"

# 2. A compiler toolchain here: nvcc, its headers and the CUDA runtime, from NVIDIA's wheels.
if [ ! -x "$build/cuda/nvidia/cu13/bin/nvcc" ]; then
  .venv/bin/pip install -q --no-deps --target "$build/cuda" "nvidia-cuda-nvcc==$CUDA.*" \
    "nvidia-cuda-crt==$CUDA.*" "nvidia-nvvm==$CUDA.*" "nvidia-cuda-runtime==$CUDA.*" "nvidia-cuda-cccl==$CUDA.*"
fi
cuda=$build/cuda/nvidia/cu13
ln -sfn lib "$cuda/lib64"
ln -sf libcudart.so.13 "$cuda/lib/libcudart.so"
# flashinfer links with -lcuda; the driver comes from the GPU machine, so an empty stub
# with the driver's soname satisfies the linker (and --as-needed drops it).
mkdir -p "$cuda/lib/stubs"
echo "" > "$build/empty.c" && gcc -shared -o "$cuda/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$build/empty.c"

# 3. flashinfer itself for this machine's Python, to generate and build its kernels.
.venv/bin/pip install -q --upgrade --target "$build/site" nvidia-ml-py einops tabulate click tqdm requests
.venv/bin/pip install -q --no-deps --upgrade --target "$build/site" "$FLASHINFER" "$TVM_FFI"
CUDA_HOME=$cuda PATH=$cuda/bin:$PATH FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$build/ws \
  PYTHONPATH=$build/site .venv/bin/python - "$root/aot" <<'PY'
import shutil, sys
from pathlib import Path

import torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module

aot = Path(sys.argv[1])
for head_dim in (64, 128):
    # The arguments BatchPrefillWithPagedKVCacheWrapper.plan builds its module from, for
    # pdmesh's calls (flashinfer_backend.plan): fa2, bf16, int32 indices, no RoPE in the
    # kernel, no sliding window, no soft cap, no fp16 QK reduction.
    spec = gen_batch_prefill_module("fa2", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                                    head_dim, head_dim, 0, False, False, False)
    spec.build(verbose=False)
    (aot / spec.name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, aot / spec.name / f"{spec.name}.so")
    print("built", spec.name)
PY
du -sh "$root/wheels" "$root/aot"
