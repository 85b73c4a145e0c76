"""The few-row product (``csrc/linear_rows.cpp``) as an AVX2-only machine builds it, timed
here: the kernels built from ``CSRC`` with ``-mno-avx512f`` (eight lanes, the AVX2 tile),
then ``linear_rows`` over the default model's weights, LM head included, at 1-16 rows.
Pass another checkout's ``pdmesh/attention/csrc`` to time its code the same way
(docs/performance/log.md, section 37). Not a stand-in for an AMD machine: the same AVX2 code on
this CPU's caches and memory.

    .venv/bin/python scripts/probes/linear/linear_rows_avx2.py [CSRC] [MODEL_DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pdmesh.attention.cpu_kernels import build_tree
from pdmesh.model.linear_plan import best_seconds
from pdmesh.model.loader import load_model


def main(csrc: Path, model_dir: str) -> None:
    torch.set_num_threads(2)
    kernels = build_tree(csrc, ("-mno-avx512f",))
    model, _, _ = load_model(model_dir, "float32", "cpu", 4096)
    weights = [m.weight.detach().contiguous() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2]
    print(f"{csrc}: {sum(w.numel() * 4 for w in weights) / 1e6:.0f} MB of weights, ms per pass (best of 10)")
    for rows in (1, 2, 4, 8, 16):
        xs = [torch.randn(rows, w.shape[1]) for w in weights]
        seconds = best_seconds(lambda xs=xs: [kernels.linear_rows(x, w) for x, w in zip(xs, weights)],
                               rounds=10, reps=1, warmup=3)
        print(f"  {rows:2d} rows: {seconds * 1e3:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csrc", nargs="?", type=Path, default=Path(__file__).parents[3] / "pdmesh/attention/csrc",
                        help="the kernels' sources to build without AVX-512")
    parser.add_argument("model", nargs="?", default=".cache/models/small-llama", help="a model folder")
    args = parser.parse_args()
    main(args.csrc, args.model)
