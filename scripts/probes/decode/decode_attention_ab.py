"""Two builds of the decode-attention kernel side by side in one process: the same inputs,
calls alternated, and their outputs checked equal bit for bit. A/B runs inside one process
are what a noisy machine still resolves.

    git worktree add /tmp/old COMMIT
    .venv/bin/python scripts/probes/decode/decode_attention_ab.py /tmp/old . [--no-avx512] [--threads N]

Each side is a built kernel module (``.so``) or a source tree, whose kernels are then built
as ``pdmesh.attention.cpu_kernels`` builds them; ``--no-avx512`` builds both trees for AVX2
alone, so that an AVX-512 machine checks and times the path AVX2-only machines run.

The pool is the engine's (``kv_pool``: one block holds every layer, on 2 MiB pages where
the host allows), and a round calls the eight layers in turn, so each call reads its
blocks from memory as a served decode step does; a pool of one layer stays in cache and
hides what memory costs (docs/performance/log.md, sections 40 and 41). Each case prints both
builds' best and median of 15 rounds, ms per layer, once their float32 outputs, and their
bfloat16 ones on a pool of that dtype, are found equal bit for bit.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import random
import statistics
from pathlib import Path
from types import ModuleType

import torch
from decode_attention_costs import HEADS, LAYERS, D, engine_pool, layer_round_ms, tables

from pdmesh.attention.cpu_kernels import build_tree

BLOCKS = 4000
CASES = {  # label: (sequences, shared prefixes, prefix tokens, own tokens)
    "32 x 768-827 private": (32, 0, 512, 256),
    "32 x 576-635 private": (32, 0, 512, 64),
    "32 x 256-315 private": (32, 0, 0, 256),
    "32 x 128-187 private": (32, 0, 64, 64),
    "32 x (512 shared of 4 + 256-315 own)": (32, 4, 512, 256),
    "32 x (512 shared of 4 + 64-123 own)": (32, 4, 512, 64),
    "64 x (512 shared of 4 + 1-60 own)": (64, 4, 512, 1),
}


def module(path: str, no_avx512: bool = False) -> ModuleType:
    """A kernel module: loaded from a ``.so``, or built from a source tree's ``csrc``."""
    if Path(path).is_dir():
        return build_tree(Path(path) / "pdmesh" / "attention" / "csrc", ("-mno-avx512f",) if no_avx512 else ())
    name = path.rsplit("/", 1)[-1].split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(old: ModuleType, new: ModuleType, rounds: int = 15) -> None:
    g = torch.Generator().manual_seed(0)
    pool, how = engine_pool(BLOCKS, g)
    perm = torch.randperm(BLOCKS, generator=g).tolist()
    print(f"torch threads {torch.get_num_threads()}; {BLOCKS} blocks of {LAYERS} layers, {how}; ms per layer")
    sides = {"old": old, "new": new}
    for label, (batch, groups, prefix, suffix) in CASES.items():
        table, lens = tables(random.Random(0), perm, batch, groups, prefix, suffix)
        q = torch.randn(batch, HEADS, D, generator=g)

        def decode(m: ModuleType, layer: int) -> torch.Tensor:
            return m.paged_decode(q, pool[:, layer], table, lens, D**-0.5)  # noqa: B023 - called in this iteration

        for layer in range(LAYERS):
            assert torch.equal(*(decode(m, layer) for m in sides.values())), f"{label}: the builds' bits differ"
        half = pool[:, 0].to(torch.bfloat16)
        outs = [m.paged_decode(q.to(torch.bfloat16), half, table, lens, D**-0.5) for m in sides.values()]
        assert torch.equal(*outs), f"{label}: the builds' bfloat16 bits differ"
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(rounds):
            for k, m in sides.items():
                times[k].append(layer_round_ms(functools.partial(decode, m)))
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{label}: old {best['old']:.3f} / {med['old']:.3f} ms, new {best['new']:.3f} / "
              f"{med['new']:.3f} ms (best / median); old / new {best['old'] / best['new']:.3f} / "
              f"{med['old'] / med['new']:.3f} (bits equal)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", help="the old side: a kernel .so, or a source tree")
    ap.add_argument("new", help="the new side: a kernel .so, or a source tree")
    ap.add_argument("--no-avx512", action="store_true", help="build source trees for AVX2 alone")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    main(module(args.old, args.no_avx512), module(args.new, args.no_avx512))
