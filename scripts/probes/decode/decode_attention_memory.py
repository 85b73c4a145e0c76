"""Decode attention against the memory it reads: the fused kernel on a pool that is not in
cache, next to plain reads of the same bytes in the same order.

    .venv/bin/python scripts/probes/decode/decode_attention_memory.py

A served model's eight layers of KV do not fit the last-level cache, so each layer's
attention reads its blocks from memory. The pool here is made as the engine makes it
(``kv_pool``, on 2 MiB pages where the host allows; ``pdmesh/kv/layout.py``: one block holds
every layer, so a KV transfer moves a block as one piece), eight layers called in turn,
best of ten rounds, for 32 sequences of 768-828 tokens (private, or after four shared
512-token prefixes), the blocks in random order or in ascending order. A layer's part of a
block is 32 KiB (K then V) of the block's 256 KiB. Beside the kernel, a small inline C++
reader sums every float of the same parts, a sequence per torch thread:
- K pass, then V pass: each part's K half (16 KiB), then each part's V half, as the kernel
  reads them (scores over every K first, the softmax, then the sums of V);
- whole parts: each part's K and V (32 KiB) at once;
- whole parts of a pool of one layer, a sequence's blocks side by side: what a layer-major
  layout (one layer's blocks contiguous) would let a reader stream.
Their GB/s are the ceilings the layout and the order leave the kernel. docs/performance/log.md,
section 40.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

import torch
from decode_attention_costs import BS, HEADS, HKV, LAYERS, D, engine_pool, layer_round_ms, tables
from torch.utils.cpp_extension import load_inline

from pdmesh.attention.cpu_kernels import load
from pdmesh.engine.kv_pool import kv_pool

BLOCKS, BATCH = 3000, 32

READER = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// The sum of every float of each sequence's block parts (``pool``: [blocks, ...], one part
// per block, any block stride): whole parts (halves = 1) or each part's first half, then
// each part's second half (halves = 2). A sequence per task.
double read_blocks(const at::Tensor& pool, const at::Tensor& tables, const at::Tensor& lens, int64_t halves) {
  const float* p = pool.data_ptr<float>();
  const int64_t* t = tables.data_ptr<int64_t>();
  const int64_t* l = lens.data_ptr<int64_t>();
  const int64_t batch = tables.size(0), width = tables.size(1), stride = pool.stride(0);
  const int64_t part = pool[0].numel() / halves, tokens = pool.size(2);
  std::vector<double> sums(batch);
  at::parallel_for(0, batch, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      __m512 acc = _mm512_setzero_ps();
      const int64_t n_blocks = (l[s] + tokens - 1) / tokens;
      for (int64_t h = 0; h < halves; ++h) {
        for (int64_t i = 0; i < n_blocks; ++i) {
          const float* base = p + t[s * width + i] * stride + h * part;
          for (int64_t x = 0; x < part; x += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(base + x));
        }
      }
      sums[s] = _mm512_reduce_add_ps(acc);
    }
  });
  double total = 0;
  for (double v : sums) total += v;
  return total;
}
"""


def best_ms(call: Callable[[int], object], rounds: int = 10) -> float:
    """Milliseconds per layer, the eight layers called in turn, best of ``rounds``."""
    layer_round_ms(call)
    return min(layer_round_ms(call) for _ in range(rounds))


def main() -> None:
    kernels = load()
    reader = load_inline("pdmesh_block_reader", cpp_sources=READER, functions=["read_blocks"],
                         extra_cflags=["-O3", "-march=native"])
    g = torch.Generator().manual_seed(0)
    pool, how = engine_pool(BLOCKS, g)
    per_layer = []  # the layer-major contrast: one pool per layer
    for _ in range(LAYERS):
        one, _ = kv_pool((BLOCKS, 2, BS, HKV, D), torch.float32, torch.device("cpu"))
        one.copy_(torch.randn(one.shape, generator=g))
        per_layer.append(one)
    print(f"torch threads {torch.get_num_threads()}; {BLOCKS} blocks of {LAYERS} layers, {how}; ms per layer")
    q = torch.randn(BATCH, HEADS, D, generator=g)
    for groups in (0, 4):
        for order in ("random", "ascending"):
            ids = torch.randperm(BLOCKS, generator=g).tolist() if order == "random" else list(range(BLOCKS))
            table, lens = tables(random.Random(0), ids, BATCH, groups, 512, 256)
            distinct = len({b for row, n in zip(table.tolist(), lens.tolist()) for b in row[:-(-n // BS)]})
            mb = distinct * pool[0, 0].numel() * 4 / 1e6
            label = "private contexts" if not groups else "4 shared 512-token prefixes"
            print(f"{BATCH} x 768-828 tokens, {label}, blocks in {order} order: {mb:.1f} MB a layer")
            ms = best_ms(lambda layer: kernels.paged_decode(q, pool[:, layer], table, lens, D**-0.5))
            print(f"  kernel                                  {ms:7.3f} ms  {mb / ms:5.1f} GB/s")
            if groups:
                continue  # the readers read every sequence's blocks, shared or not
            for halves, what in ((2, "read: K pass, then V pass"), (1, "read: whole parts")):
                ms = best_ms(lambda layer, h=halves: reader.read_blocks(pool[:, layer], table, lens, h))
                print(f"  {what:<39} {ms:7.3f} ms  {mb / ms:5.1f} GB/s")
            ms = best_ms(lambda layer: reader.read_blocks(per_layer[layer], table, lens, 1))
            print(f"  {'read: whole parts, a pool per layer':<39} {ms:7.3f} ms  {mb / ms:5.1f} GB/s")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
