"""The fused CPU decode-attention kernel alone, on one layer of a synthetic paged pool:
sequences over shared prefix blocks (read once for all of them) against the same
contexts with every block private, and the random serving shape.

    .venv/bin/python scripts/probes/decode/decode_attention_costs.py

The pool here is small enough to stay in the last-level cache between calls, unlike a
served model's eight layers: these are the kernel's compute-side costs; the engine's
(``scripts/probes/decode/decode_step_costs.py``) include the memory traffic. docs/performance/log.md,
section 16.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch

from pdmesh.attention.cpu_kernels import load
from pdmesh.engine.kv_pool import kv_pool

BS, HKV, D, HEADS = 16, 4, 64, 8  # the default model's attention
LAYERS = 8  # the default model's layers


def random_pool(shape: tuple[int, ...], g: torch.Generator) -> tuple[torch.Tensor, str]:
    """A random float32 pool of ``shape`` on the engine's memory (``kv_pool``: 2 MiB pages
    where the host allows), and how its memory was made."""
    pool, how = kv_pool(shape, torch.float32, torch.device("cpu"))
    pool.copy_(torch.randn(pool.shape, generator=g))
    return pool, how


def engine_pool(blocks: int, g: torch.Generator) -> tuple[torch.Tensor, str]:
    """A random pool laid out as the engine's (``pdmesh/kv/layout.py``: a block holds every
    layer). Too large for any cache: read layer by layer, it comes from memory."""
    return random_pool((blocks, LAYERS, 2, BS, HKV, D), g)


def layer_round_ms(call: Callable[[int], object]) -> float:
    """Milliseconds per layer of one round calling ``call(layer)`` for each layer in turn, as
    a decode step does: a layer's blocks are then not in cache from its last call."""
    start = time.perf_counter()
    for layer in range(LAYERS):
        call(layer)
    return (time.perf_counter() - start) / LAYERS * 1e3


def tables(rng: random.Random, perm: list[int], batch: int, groups: int, prefix: int, suffix: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables (padded) and lengths: ``groups`` shared prefixes, or none when 0."""
    ids = iter(perm)
    shared = [[next(ids) for _ in range(prefix // BS)] for _ in range(groups)]
    rows, lens = [], []
    for i in range(batch):
        n = prefix + suffix + rng.randrange(0, 60)
        head = shared[i % groups] if groups else [next(ids) for _ in range(prefix // BS)]
        rows.append(head + [next(ids) for _ in range(-(-n // BS) - prefix // BS)])
        lens.append(n)
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows]), torch.tensor(lens)


def ms_per_call(batch: int, groups: int, prefix: int, suffix: int, reps: int = 50) -> float:
    kernels, g, rng = load(), torch.Generator().manual_seed(0), random.Random(0)
    pool = torch.randn(8000, 2, BS, HKV, D, generator=g)
    table, lens = tables(rng, torch.randperm(8000, generator=g).tolist(), batch, groups, prefix, suffix)
    q = torch.randn(batch, HEADS, D, generator=g)
    for _ in range(5):
        kernels.paged_decode(q, pool, table, lens, D**-0.5)
    start = time.perf_counter()
    for _ in range(reps):
        kernels.paged_decode(q, pool, table, lens, D**-0.5)
    return (time.perf_counter() - start) / reps * 1e3


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(f"torch threads {torch.get_num_threads()}; one layer, ms per call:")
    print(f"  64 sequences over 4 shared 512-token prefixes + 64-123 own: {ms_per_call(64, 4, 512, 64):.3f}")
    print(f"  the same contexts, every block private:                   {ms_per_call(64, 0, 512, 64):.3f}")
    print(f"  32 sequences of 256-315 private tokens:                   {ms_per_call(32, 0, 0, 256):.3f}")
