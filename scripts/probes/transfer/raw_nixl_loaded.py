"""Raw NIXL's two ceilings (``pdmesh/bench/raw_nixl.py``) on an idle machine and beside a
decode loop, alternated.

In a mesh a prefill worker writes a prompt's KV while the other core runs a decode step
or another prompt, both of which stream weights and KV from memory. If that traffic
slowed the copy, the mesh's writes would be measured against a ceiling taken on an idle
machine. This measures the ceilings both ways in turn: alone, and while a child process
runs decode steps at batch 32 over ~288-token contexts on one thread (the engine itself,
refilled as its sequences finish), ``--rounds`` times:

    .venv/bin/python scripts/probes/transfer/raw_nixl_loaded.py --model .cache/models/small-llama
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from pdmesh.bench.raw_nixl import raw_nixl_gib_s

WRITE_BLOCKS = 16
"""Blocks per write: a 256-token prompt at 16 tokens per block, as ``bench mesh`` writes."""


def decode_loop(model: str) -> None:
    """The child's body: decode steps on one thread until killed."""
    import torch

    from pdmesh.bench.profile import _fill, run_to_decode
    from pdmesh.config import EngineArgs
    from pdmesh.engine.llm_engine import LLMEngine

    torch.set_num_threads(1)
    engine = LLMEngine(EngineArgs(model=model, dtype="float32", num_blocks=4096, threads=1).engine_config())
    while True:
        _fill(engine, 32, 288, 200)
        run_to_decode(engine)
        while engine.has_unfinished_requests():
            engine.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=25.0, help="the decode loop's start-up before measuring")
    ap.add_argument("--decode-loop", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.decode_loop:
        decode_loop(args.model)
        return
    from pdmesh.model.config import ModelConfig

    cfg = ModelConfig.from_dir(args.model)
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 16 * 4  # K and V, float32, 16 tokens
    print(f"{WRITE_BLOCKS}-block writes of {block_bytes // 1024} KiB blocks, GiB/s")
    print("round | idle: fresh, same blocks | beside a decode loop: fresh, same blocks")
    for r in range(args.rounds):
        idle = raw_nixl_gib_s(block_bytes, WRITE_BLOCKS, fresh=True), raw_nixl_gib_s(block_bytes, WRITE_BLOCKS)
        child = subprocess.Popen([sys.executable, __file__, "--model", args.model, "--decode-loop"],
                                 env=dict(os.environ, OMP_NUM_THREADS="1"),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(args.settle_s)
            if child.poll() is not None:
                raise SystemExit(f"the decode loop exited ({child.returncode}) before it was measured beside")
            busy = raw_nixl_gib_s(block_bytes, WRITE_BLOCKS, fresh=True), raw_nixl_gib_s(block_bytes, WRITE_BLOCKS)
        finally:
            child.kill()
            child.wait()
        print(f"{r + 1:>5} | {idle[0]:.2f}, {idle[1]:.2f} | {busy[0]:.2f}, {busy[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
