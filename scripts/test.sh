#!/usr/bin/env bash
# Set up ./.venv and run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Lint and types first (pyproject.toml's [tool.ruff] and [tool.mypy]; ~1 min cold, seconds
# warm): a suppression left in the code then marks something real.
.venv/bin/ruff check .
.venv/bin/mypy
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$rc"
