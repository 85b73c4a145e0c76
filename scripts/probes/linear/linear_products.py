"""The model's linear products three ways, by row count (docs/performance/log.md §15).

    .venv/bin/python scripts/probes/linear/linear_products.py --model .cache/models/small-llama [--threads 2]

For each row count, the time of the model's five weight shapes (q/k/v, o, gate/up, down,
LM head) through ``linear`` as it runs without oneDNN (pdmesh's few-row kernel up to 31
rows where built, MKL above), through MKL's ``F.linear``, and through oneDNN's product on
weights packed once (``pdmesh.model.onednn``); GFLOP/s and the ratio to oneDNN. Random
inputs and weights of the model's shapes; best of 5 rounds of 30 calls.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from pdmesh.attention.cpu_kernels import load
from pdmesh.model import onednn
from pdmesh.model.layers import few_rows_kernel, linear
from pdmesh.model.linear_plan import best_seconds

ROWS = (1, 4, 8, 16, 31, 64, 256, 1024)


def _best(fn: Callable[[], object]) -> float:
    return best_seconds(fn, rounds=5, reps=30, warmup=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    h, inter, heads, kv = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                           cfg["num_key_value_heads"])
    dim = h // heads
    shapes = [((heads + 2 * kv) * dim, h), (h, h), (2 * inter, h), (h, inter), (cfg["vocab_size"], h)]
    weights = [torch.randn(*s) for s in shapes]
    packed = [onednn.pack(w) for w in weights]
    few_rows = few_rows_kernel(load())
    print(f"{'rows':>5} {'pdmesh (no oneDNN)':>19} {'MKL F.linear':>13} {'oneDNN':>8}  GFLOP/s; "
          "oneDNN's speedup over pdmesh")
    for rows in ROWS:
        xs = [torch.randn(rows, w.shape[1]) for w in weights]
        flop = sum(2 * rows * w.shape[0] * w.shape[1] for w in weights)
        ours = _best(lambda: [linear(x, w, few_rows=few_rows) for x, w in zip(xs, weights)])
        mkl = _best(lambda: [F.linear(x, w) for x, w in zip(xs, weights)])
        dnn = _best(lambda: [onednn.product(x, p, None) for x, p in zip(xs, packed)])
        print(f"{rows:5d} {flop / ours / 1e9:19.1f} {flop / mkl / 1e9:13.1f} {flop / dnn / 1e9:8.1f}  "
              f"{ours / dnn:.2f}x")


if __name__ == "__main__":
    main()
