"""Host time per step of what the model runner builds for attention at large decode batches.

A GPU step's host work runs while the GPU waits (docs/performance/log.md sections 48-49); this
times, on the CPU alone, the two forms the runner can build for a batch of decode rows:
the padded block tables the torch and CPU backends read, and the page index flashinfer
plans from (``pdmesh/attention/paged_index.py``).
Usage: .venv/bin/python scripts/probes/decode/paged_index_probe.py [--rows 128] [--context 4112]
"""

from __future__ import annotations

import argparse

import torch

from pdmesh.attention.paged_index import PagedRow, paged_index
from pdmesh.bench.stats import median_seconds
from pdmesh.engine.model_runner import _padded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=128, help="decode rows (default: 128)")
    ap.add_argument("--context", type=int, default=4112, help="tokens per row (default: 4112)")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block (default: 16)")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions, median reported (default: 50)")
    args = ap.parse_args()
    blocks = -(-args.context // args.block_size) + 4  # tables hold a few blocks past the context
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(args.rows)]
    lens = [args.context] * args.rows
    padded = 1e3 * median_seconds(lambda: (_padded(tables, "cpu"), torch.tensor(lens)), reps=args.reps)
    index = 1e3 * median_seconds(lambda: paged_index([PagedRow(1, n, t) for t, n in zip(tables, lens)],
                                                     args.block_size), reps=args.reps)
    print(f"{args.rows} rows x {args.context} tokens ({blocks} blocks each), median of {args.reps}:")
    print(f"  padded block tables (torch / CPU backends): {padded:.2f} ms")
    print(f"  page index (flashinfer):                    {index:.2f} ms")


if __name__ == "__main__":
    main()
