"""What the decode-attention kernel would gain from another KV pool layout, before anyone
builds one: the kernel as it is, over the engine's pool and over a layer-major one, each
with a sequence's blocks scattered (as the allocator hands them out) and side by side.

    .venv/bin/python scripts/probes/decode/decode_attention_layout.py [--rounds N]

The engine's pool holds every layer of a block in one piece (``pdmesh/kv/layout.py``), so a
KV transfer moves a block as one descriptor; a layer's part of a block is then 32 KiB of
every 256 KiB. A layer-major pool (one pool per layer, here) with a sequence's blocks
adjacent lets a layer's K and V be read as one run, which a plain read does 1.8x faster
than the engine's layout (``decode_attention_memory.py``, docs/performance/log.md section 40).
This script asks what the kernel itself gains: all four layouts are read by the same build,
eight layers in turn so that each call reads memory, calls alternated; medians, ms per
layer, and each layout's speed-up over the engine's pool with scattered blocks (section 42).
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
from collections.abc import Callable

import torch
from decode_attention_costs import BS, HEADS, HKV, LAYERS, D, engine_pool, layer_round_ms, random_pool, tables

from pdmesh.attention.cpu_kernels import load

KERNELS = load()
BLOCKS = 4000
CASES = {  # label: (sequences, shared prefixes, prefix tokens, own tokens)
    "32 x 768-827 private": (32, 0, 512, 256),
    "32 x 256-315 private": (32, 0, 0, 256),
    "32 x (512 shared of 4 + 64-123 own)": (32, 4, 512, 64),
}


def layer_major_pools(blocks: int, g: torch.Generator) -> list[torch.Tensor]:
    """One random pool per layer, each on the engine's kind of memory."""
    return [random_pool((blocks, 2, BS, HKV, D), g)[0] for _ in range(LAYERS)]


def decode(q: torch.Tensor, view: Callable[[int], torch.Tensor], table: torch.Tensor, lens: torch.Tensor,
           layer: int) -> torch.Tensor:
    return KERNELS.paged_decode(q, view(layer), table, lens, D**-0.5)


def main(rounds: int) -> None:
    g = torch.Generator().manual_seed(0)
    engine, how = engine_pool(BLOCKS, g)
    by_layer = layer_major_pools(BLOCKS, g)
    scattered, adjacent = torch.randperm(BLOCKS, generator=g).tolist(), list(range(BLOCKS))
    layouts = {  # label: (a layer's view of the pool, block ids handed out in this order)
        "engine, scattered": (lambda layer: engine[:, layer], scattered),
        "engine, adjacent": (lambda layer: engine[:, layer], adjacent),
        "layer-major, scattered": (lambda layer: by_layer[layer], scattered),
        "layer-major, adjacent": (lambda layer: by_layer[layer], adjacent),
    }
    print(f"torch threads {torch.get_num_threads()}; {BLOCKS} blocks of {LAYERS} layers, {how}; "
          f"median ms per layer of {rounds} rounds (speed-up over the engine's pool, scattered)")
    for label, (batch, groups, prefix, suffix) in CASES.items():
        q = torch.randn(batch, HEADS, D, generator=g)
        calls = {name: functools.partial(decode, q, view, *tables(random.Random(0), ids, batch, groups, prefix, suffix))
                 for name, (view, ids) in layouts.items()}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                times[name].append(layer_round_ms(call))
        base = statistics.median(times["engine, scattered"])
        print(f"  {label}")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"    {name:<24} {med:7.3f}  {base / med:5.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    main(parser.parse_args().rounds)
