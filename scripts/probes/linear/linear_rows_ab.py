"""Two builds of the few-row product (``linear_rows``) side by side in one process: over
the default model's eight layers of weights streamed from memory as a decode step reads
them, and over one weight per shape that stays in cache, per row count, calls alternated
(``best_seconds_of``; docs/performance/log.md, section 44).

    git worktree add /tmp/old COMMIT
    .venv/bin/python scripts/probes/linear/linear_rows_ab.py /tmp/old . [--no-avx512] [--rows 1,8,32] [--onednn]

Each side is a source tree whose kernels are built as ``pdmesh.attention.cpu_kernels``
builds them (``--no-avx512``: both for AVX2 alone, the code AVX2-only machines run). For
each row count it prints both sides' ms and GFLOP/s, old / new, and whether their outputs
are equal bit for bit (else the largest difference); ``--onednn`` adds oneDNN's packed
product over the streamed weights.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from pdmesh.attention.cpu_kernels import build_tree
from pdmesh.model import onednn
from pdmesh.model.linear_plan import best_seconds, best_seconds_of

LAYERS = 8  # the default model's layers, as the attention probes take them

SHAPES = [(1024, 512), (512, 512), (2048, 512), (2048, 512), (512, 2048)]
"""One layer's weights [out, in] of the default model: qkv, o, gate, up, down."""


def over(fn, xs: dict[int, torch.Tensor], weights: list[torch.Tensor]) -> None:  # type: ignore[no-untyped-def]
    """``fn(x, w)`` for every weight, x the rows of its input width."""
    for w in weights:
        fn(xs[w.shape[1]], w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--no-avx512", action="store_true")
    ap.add_argument("--rows", default="1,2,4,8,16,24,32,48,63")
    ap.add_argument("--onednn", action="store_true", help="also oneDNN's packed product (streamed)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    flags = ("-mno-avx512f",) if args.no_avx512 else ()
    old, new = (build_tree(Path(t) / "pdmesh" / "attention" / "csrc", flags).linear_rows for t in (args.old, args.new))
    g = torch.Generator().manual_seed(0)
    streamed = [torch.randn(o, i, generator=g) * 0.02 for _ in range(LAYERS) for o, i in SHAPES]
    in_cache = streamed[:len(SHAPES)]
    packed = {id(w): onednn.pack(w) for w in streamed} if args.onednn and onednn.available() else {}
    print("ms over 8 layers' weights streamed (GFLOP/s) | GFLOP/s over one weight per shape in cache")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {i: torch.randn(rows, i, generator=g) for _, i in SHAPES}
        flops = 2 * rows * sum(o * i for o, i in SHAPES)
        diff = max((old(xs[w.shape[1]], w) - new(xs[w.shape[1]], w)).abs().max().item() for w in streamed)
        s = dict(zip(("old", "new"), best_seconds_of(
            *[functools.partial(over, fn, xs, streamed) for fn in (old, new)], rounds=3, reps=5)))
        c = dict(zip(("old", "new"), best_seconds_of(
            *[functools.partial(over, fn, xs, in_cache) for fn in (old, new)], rounds=3, reps=20)))
        line = (f"{rows:3d} rows: old {s['old'] * 1e3:6.2f} ({LAYERS * flops / s['old'] / 1e9:3.0f})"
                f"  new {s['new'] * 1e3:6.2f} ({LAYERS * flops / s['new'] / 1e9:3.0f})  old / new {s['old'] / s['new']:.2f}x"
                f" | old {flops / c['old'] / 1e9:3.0f}  new {flops / c['new'] / 1e9:3.0f}  {c['old'] / c['new']:.2f}x"
                f"  ({'bits equal' if diff == 0 else f'largest difference {diff:.3g}'})")
        if packed:
            o = best_seconds(functools.partial(over, lambda x, w: onednn.product(x, packed[id(w)], None), xs, streamed),
                             rounds=3, reps=5)
            line += f"  oneDNN {o * 1e3:6.2f} ({LAYERS * flops / o / 1e9:3.0f}), oneDNN / new {o / s['new']:.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
