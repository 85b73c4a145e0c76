#!/usr/bin/env bash
# Regenerate pdmesh/v1/*_pb2*.py from protos/ (never edit the generated files by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. --pyi_out=. protos/pdmesh/v1/*.proto
