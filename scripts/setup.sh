#!/usr/bin/env bash
# Create ./.venv with pdmesh (editable) and its dev tools. Idempotent: a second run with an
# unchanged pyproject.toml returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=.venv/.pdmesh-setup
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
warm_kernels() {
  # Build pdmesh's C++ CPU kernels now (cached per machine) rather than in the first
  # worker to start; if they cannot be built, the engine says why and uses torch's path.
  .venv/bin/python -c "from pdmesh.attention.cpu_kernels import load; load()" \
    || echo "setup: the CPU attention kernels did not build; the torch backend will be used" >&2
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  warm_kernels
  exit 0
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
# torch first, pinned: this exact version is the local CPU wheel; anything else downloads
# gigabytes of CUDA builds.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps nixl 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import torch, pdmesh, transformers, grpc, nixl._api" >/dev/null
echo "$want" > "$stamp"
warm_kernels
