"""Decode attention against the memory it reads: the fused kernel on pools that are not in
cache, next to plain reads of the same blocks in the same order.

    .venv/bin/python scripts/decode_attention_memory.py

A served model's eight layers of KV do not fit the last-level cache, so each layer's
attention reads its blocks from memory. Here eight layer pools (made as the engine makes
them: ``kv_pool``, on 2 MiB pages where the host allows) are read in turn, one call each,
best of ten rounds, for the shape of 32 sequences of 768-828 tokens (private, or after
four shared 512-token prefixes). Beside the kernel, a small inline C++ reader sums every
float of the same blocks, each sequence on one of torch's threads, in three orders:
- K pass, then V pass: each block's K half (16 KiB), then each block's V half, as the
  kernel reads them (scores over every K first, the softmax, then the sums of V);
- whole blocks: each block's K and V (32 KiB) at once;
- the same, over blocks laid side by side (what a contiguous cache would allow).
Their GB/s are the ceilings the kernel's layout and order leave it. docs/performance.md,
section 40.
"""

from __future__ import annotations

import random
import time

import torch
from torch.utils.cpp_extension import load_inline

from pdmesh.attention.cpu_kernels import load
from pdmesh.engine.kv_pool import kv_pool

BS, HKV, D, HEADS = 16, 4, 64, 8  # the default model's attention
LAYERS, BLOCKS, BATCH = 8, 3000, 32

READER = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// The sum of every float of each sequence's blocks: whole blocks (halves = 1) or each
// block's first half, then each block's second half (halves = 2). A sequence per task.
double read_blocks(const at::Tensor& pool, const at::Tensor& tables, const at::Tensor& lens, int64_t halves) {
  const float* p = pool.data_ptr<float>();
  const int64_t* t = tables.data_ptr<int64_t>();
  const int64_t* l = lens.data_ptr<int64_t>();
  const int64_t batch = tables.size(0), width = tables.size(1), block = pool.stride(0), part = block / halves;
  const int64_t tokens = pool.size(2);
  std::vector<double> sums(batch);
  at::parallel_for(0, batch, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      __m512 acc = _mm512_setzero_ps();
      const int64_t n_blocks = (l[s] + tokens - 1) / tokens;
      for (int64_t h = 0; h < halves; ++h) {
        for (int64_t i = 0; i < n_blocks; ++i) {
          const float* base = p + t[s * width + i] * block + h * part;
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


def tables(rng: random.Random, ids: list[int], groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables (padded) and lengths of the served shape: 256-315 own tokens after a
    512-token prefix, shared by ``groups`` groups (0: every block private)."""
    it = iter(ids)
    shared = [[next(it) for _ in range(512 // BS)] for _ in range(max(groups, 1))]
    rows, lens = [], []
    for i in range(BATCH):
        n = 512 + 256 + rng.randrange(0, 60)
        head = shared[i % groups] if groups else [next(it) for _ in range(512 // BS)]
        rows.append(head + [next(it) for _ in range(-(-n // BS) - 512 // BS)])
        lens.append(n)
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows]), torch.tensor(lens)


def best_ms(call, pools: list[torch.Tensor], rounds: int = 10) -> float:
    for p in pools:
        call(p)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for p in pools:
            call(p)
        best = min(best, (time.perf_counter() - start) / len(pools))
    return best * 1e3


def main() -> None:
    kernels = load()
    reader = load_inline("pdmesh_block_reader", cpp_sources=READER, functions=["read_blocks"],
                         extra_cflags=["-O3", "-march=native"])
    g, rng = torch.Generator().manual_seed(0), random.Random(0)
    pools = []
    for _ in range(LAYERS):
        pool, how = kv_pool((BLOCKS, 2, BS, HKV, D), torch.float32, torch.device("cpu"))
        pool.copy_(torch.randn(pool.shape, generator=g))
        pools.append(pool)
    print(f"torch threads {torch.get_num_threads()}; {LAYERS} pools of {BLOCKS} blocks, {how}; ms per layer")
    q = torch.randn(BATCH, HEADS, D, generator=g)
    for groups in (0, 4):
        table, lens = tables(rng, torch.randperm(BLOCKS, generator=g).tolist(), groups)
        distinct = len({b for row, n in zip(table.tolist(), lens.tolist()) for b in row[:-(-n // BS)]})
        mb = distinct * pools[0].stride(0) * 4 / 1e6
        label = "private contexts" if not groups else "4 shared 512-token prefixes"
        print(f"{BATCH} x 768-828 tokens, {label}: {mb:.1f} MB of distinct blocks per layer")
        ms = best_ms(lambda p: kernels.paged_decode(q, p, table, lens, D**-0.5), pools)
        print(f"  kernel                         {ms:7.3f} ms  {mb / ms:5.1f} GB/s")
        if groups:
            continue  # the readers read every sequence's blocks, shared or not
        for halves, what in ((2, "read: K pass, then V pass"), (1, "read: whole blocks")):
            ms = best_ms(lambda p, h=halves: reader.read_blocks(p, table, lens, h), pools)
            print(f"  {what:<30} {ms:7.3f} ms  {mb / ms:5.1f} GB/s")
        side = torch.arange(table.numel()).reshape(table.shape) % BLOCKS
        ms = best_ms(lambda p: reader.read_blocks(p, side, lens, 1), pools)
        print(f"  {'read: whole blocks, side by side':<30} {ms:7.3f} ms  {mb / ms:5.1f} GB/s")


if __name__ == "__main__":
    main()
