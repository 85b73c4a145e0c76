"""Greedy tokens of any model folder through a real mesh (1 prefill + 1 decode worker, the
kvstore tier, KV over NIXL, prompts prefilled 32 tokens at a time) against transformers on
the same folder, float32; then the same prompts again, served from the prefix cache. For a
family the suite runs in process only (its mesh path shared with one the suite meshes).

    PYTHONPATH=. .venv/bin/python scripts/probes/models/mesh_greedy_exact.py DIR [--prompts 10]

DIR: e.g. ``pdmesh model make-tiny DIR --arch deepseek_v2`` (docs/attention-variants.md
keeps the figures). Prints how many sequences equal transformers' on each pass.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from pdmesh.client import Client
from pdmesh.launcher import Mesh, MeshSpec
from tests.oracle import HFReference, mixed_prompts

NEW = 24


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompts", type=int, default=10)
    args = ap.parse_args()
    ref = HFReference(args.model)
    prompts = mixed_prompts(args.prompts, seed=41)
    want = [ref.greedy(p, NEW) for p in prompts]
    spec = MeshSpec(model=args.model, prefill=1, decode=1, kvstore=1, worker_args=["--dtype", "float32"],
                    prefill_args=["--max-num-batched-tokens", "32"], share_cores=False,
                    log_dir=tempfile.mkdtemp(prefix="mesh-greedy-"))
    with Mesh(spec) as mesh, Client(mesh.router_address, timeout=120) as client:
        passes = [[client.complete(p, max_tokens=NEW, temperature=0).token_ids for p in prompts]
                  for _ in range(2)]
    for name, got in zip(("fresh", "prefix-cached"), passes):
        equal = sum(g == w for g, w in zip(got, want))
        print(f"{name}: {equal}/{len(prompts)} sequences equal transformers' greedy tokens")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
