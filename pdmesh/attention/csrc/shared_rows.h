// Decode attention's two products over a run of tokens that several query rows read
// together: the members of a prefix group (sequences whose block tables begin with the same
// shared blocks) and the query heads of a GQA group. Over such a run the kernel can work
// across rows rather than along head_dim: one K or V row is loaded once and serves every
// query row in a vector register's lanes, with no horizontal sums per (query, key) pair.
//
// What it must not change is a row's bits: a sequence's attention has to be the same
// whether its prefix is shared with others or not (paged_attention.cpp computes the private
// part of every context with dot4 and weighted_sum_rows for one row). ``dot4_lanes``
// therefore performs dot4's exact arithmetic in each lane: the same FMA chains from zero
// over the same elements, then the same tree of additions; ``weighted_sum_rows`` sums
// several rows at once, each row's FMAs in token order as for one.
#pragma once

#include <cstdint>

#include "vec_math.h"

namespace pdmesh {

constexpr int kIntoL1 = 3;  // __builtin_prefetch's locality: prefetcht0
constexpr int kIntoL2 = 1;  // prefetcht2: L2 only

// Asks for the cache lines of one token's row of ``n`` elements ahead of use: a block's
// rows cross 4 KiB pages, where the hardware prefetcher stops, and blocks are scattered.
template <int locality = kIntoL1, typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(c + off, 0, locality);
}

// How far ahead, in tokens, rows are also asked for into L2: four blocks of 16 tokens. A
// layer's part of a block is a short run of memory (16 KiB of K, then 16 KiB of V, with the
// block's other layers between it and the next block's), and the near prefetch above starts
// each run too late for memory to stream. Asking for the rows 32-128 tokens ahead into L2
// made the kernel 4-11% faster over private 128-768-token contexts read from memory, and
// 0-4% over shared prefixes (whose rows mostly come from cache); a plain reader of the same
// parts gained less asking for them into L1 (docs/performance/log.md, section 41).
constexpr int64_t kFarRows = 64;  // asked for into L2 (kIntoL2): L1 would lose them first

}  // namespace pdmesh

#ifdef PDMESH_AVX2
namespace pdmesh {

// qt[x * V::W + lane] = rows[lane][x] for x < dim: up to V::W query rows transposed, so one
// vector load gives one element of every row; lanes past ``n`` are zero (their results are
// computed and never stored).
template <class V>
inline void transpose_rows(const float* const* rows, int n, int64_t dim, float* qt) {
  for (int64_t x = 0; x < dim; ++x) {
    for (int lane = 0; lane < V::W; ++lane) qt[x * V::W + lane] = lane < n ? rows[lane][x] : 0.f;
  }
}

// One of dot4's partial sums, for four tokens: lane j of its accumulators, i.e. the FMA
// chain from zero over elements j, j + L, j + 2L ... (and, where dot4 runs sixteen lanes
// wide, L = 16, the upper half's chain j + 8, j + 24 ... added to it as dot4 adds its
// halves). Each of the V::W query rows in ``qt`` gets its own lane.
template <class V, int L>
inline void dot4_partial(const float* qt, const float* const k[4], int64_t dim, int64_t j, typename V::R* a) {
  using R = typename V::R;
  for (int u = 0; u < 4; ++u) a[u] = V::zero();
  if constexpr (L == 16) {
    R hi[4];
    for (int u = 0; u < 4; ++u) hi[u] = V::zero();
    for (int64_t c = j; c < dim; c += 16) {
      const R lo_q = V::load(qt + c * V::W), hi_q = V::load(qt + (c + 8) * V::W);
      for (int u = 0; u < 4; ++u) {
        a[u] = V::fma(lo_q, V::set1(k[u][c]), a[u]);
        hi[u] = V::fma(hi_q, V::set1(k[u][c + 8]), hi[u]);
      }
    }
    for (int u = 0; u < 4; ++u) a[u] = V::add(a[u], hi[u]);
  } else {
    for (int64_t c = j; c < dim; c += 8) {
      const R q = V::load(qt + c * V::W);
      for (int u = 0; u < 4; ++u) a[u] = V::fma(q, V::set1(k[u][c]), a[u]);
    }
  }
}

// Scores of four tokens (K rows k[0..3]) against V::W query rows: out[u * V::W + lane] is
// exactly dot4(row lane, k)[u] * scale. dot4 ends with two hadds and an add, i.e.
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) over its eight partial sums p_j; so
// does this, with the pairs formed as the partial sums are.
template <class V, int L>
inline void dot4_lanes(const float* qt, const float* const k[4], int64_t dim, float scale, float* out) {
  using R = typename V::R;
  R even[4], odd[4], low[4], high[4];
  for (int half = 0; half < 2; ++half) {
    R* sum = half == 0 ? low : high;
    for (int pair = 0; pair < 2; ++pair) {
      const int64_t j = 4 * half + 2 * pair;
      dot4_partial<V, L>(qt, k, dim, j, even);
      dot4_partial<V, L>(qt, k, dim, j + 1, odd);
      for (int u = 0; u < 4; ++u) {
        const R p = V::add(even[u], odd[u]);
        sum[u] = pair == 0 ? p : V::add(sum[u], p);
      }
    }
  }
  const R s = V::set1(scale);
  for (int u = 0; u < 4; ++u) V::store(out + u * V::W, V::mul(V::add(low[u], high[u]), s));
}

// acc[m][0, N W) += sum over t of w[m][t] * v_t[0, N W) for M rows at once, the accumulators
// held in registers over every token (each FMA then costs one load, not a load, a load and
// a store). Each V row is loaded once for all M, and every row's FMAs run in token order, so
// a row has the same bits whatever M it was summed with. M = 1 is the private path's sum.
// ``prefetch``: this call is its rows' first reader, and asks for them ahead; ``far``, the
// floats from each row's ``offset`` it asks for ``kFarRows`` ahead (every head the later
// readers of the same rows sum), 0 for none.
template <class V, int N, int M>
inline void weighted_sum_rows(const float* const* w, const float* const* v, int64_t offset, int64_t t0,
                              int64_t t1, float* const* acc, bool prefetch, int64_t far) {
  // With one row each load folds into its FMA; with several a row is held for all of them.
  static_assert(M == 1 || (M + 1) * N + 1 <= V::REGS, "accumulators, a row and a weight must fit");
  using R = typename V::R;
  R a[M][N];
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) a[m][j] = V::load(acc[m] + V::W * j);
  }
  for (int64_t t = t0; t < t1; ++t) {
    if (prefetch && t + 4 < t1) prefetch_row(v[t + 4] + offset, V::W * N);
    if (far && t + kFarRows < t1) prefetch_row<kIntoL2>(v[t + kFarRows] + offset, far);
    const float* row = v[t] + offset;
    R x[N];
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) x[j] = V::load(row + V::W * j);
    for (int m = 0; m < M; ++m) {
      const R wt = V::set1(w[m][t]);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) a[m][j] = V::fma(wt, x[j], a[m][j]);
    }
  }
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) V::store(acc[m] + V::W * j, a[m][j]);
  }
}

}  // namespace pdmesh
#endif
