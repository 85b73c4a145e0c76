#!/usr/bin/env bash
# Create ./.venv with pdmesh (editable) and its dev tools. Idempotent: a second run with an
# unchanged pyproject.toml returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=.venv/.pdmesh-setup
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
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
