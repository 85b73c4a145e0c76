// The register tiles of the few-row product: y = x @ w.T for a few rows of x, each weight
// row read once from memory and used for up to four rows of x (linear_rows.cpp says why and
// what was measured). Shared by linear_rows.cpp (one weight) and moe_rows.cpp (each
// expert's weights against that expert's rows).
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec_math.h"

#ifdef PDMESH_AVX2
namespace pdmesh::rows {

using pdmesh::Widest;

constexpr int kMR = 4;
constexpr int kNR = Widest::REGS >= 32 ? 6 : 3;
constexpr int64_t kLineFloats = 16;  // a 64-byte cache line

// MR rows of x against NR rows of w; ``next`` is the weight run the following tile reads.
// ``kPin``: the weight vectors are held in registers (for more rows of x than one tile's).
template <int MR, int NR, bool kPin>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy,
                 const float* next) {
  using V = Widest;
  typename V::R acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = V::zero();
  int64_t k = 0;
  for (; k + V::W <= K; k += V::W) {
    typename V::R wv[NR];  // NR weight vectors, one x vector, MR x NR accumulators: all in registers
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if (k % kLineFloats == 0) _mm_prefetch(reinterpret_cast<const char*>(next + j * K + k), _MM_HINT_T1);
      wv[j] = V::load(w + j * K + k);
      // Pinned in a register: without it GCC folds the load into each of the row's MR
      // FMAs, so a step loaded every weight vector MR times (28 loads for 24 FMAs at
      // 4 x 6) and ran at half the FMA units' rate even from L1. That only matters where
      // the tile is read again for more rows of x; at 2-4 rows, where each tile is read
      // once and memory sets the pace, the pinned loads ran up to 14% slower.
      if constexpr (kPin) asm("" : "+v"(wv[j]));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const typename V::R xv = V::load(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
    }
  }
  // Spill through an array written in unrolled loops: indexing the accumulators in the
  // reduction loop below made GCC keep them in memory inside the hot loop above.
  alignas(64) float lanes[MR][NR][V::W];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) V::store(lanes[i][j], acc[i][j]);
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = V::sum(V::load(lanes[i][j]));
      for (int64_t kk = k; kk < K; ++kk) s += x[i * ldx + kk] * w[j * K + kk];
      y[i * ldy + j] = s;
    }
  }
}

// Every row of x against NR consecutive rows of w, four at a time.
template <int NR, bool kPin>
void tiles_of_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, float* y, int64_t N,
                  const float* next) {
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) tile<kMR, NR, kPin>(x + m * ldx, ldx, w, K, y + m * N, N, next);
  switch (M - m) {
    case 3: tile<3, NR, kPin>(x + m * ldx, ldx, w, K, y + m * N, N, next); break;
    case 2: tile<2, NR, kPin>(x + m * ldx, ldx, w, K, y + m * N, N, next); break;
    case 1: tile<1, NR, kPin>(x + m * ldx, ldx, w, K, y + m * N, N, next); break;
    default: break;
  }
}

// The same, the weight vectors held in registers where x has more rows than one tile's four
// (each weight tile is then read again from L1 or L2, and the folded loads cost FMA slots).
template <int NR>
void rows_against(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, float* y, int64_t N,
                  const float* next) {
  if (M > kMR) {
    tiles_of_rows<NR, true>(x, ldx, M, K, w, y, N, next);
  } else {
    tiles_of_rows<NR, false>(x, ldx, M, K, w, y, N, next);
  }
}


// y[:, n0:n1] = x @ w[n0:n1].T for rows [n0, n1) of w ([N, K], contiguous), y with ``ldy``:
// NR rows at a time, the rest one by one; ``next`` is what the caller reads after (a
// prefetch target inside the weights).
inline void weight_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, int64_t n0, int64_t n1,
                        float* y, int64_t ldy, const float* next) {
  for (int64_t n = n0; n < n1; n += kNR) {
    if (n1 - n >= kNR) {
      rows_against<kNR>(x, ldx, M, K, w + n * K, y + n, ldy, n + 2 * kNR <= n1 ? w + (n + kNR) * K : next);
    } else {
      for (int64_t r = n; r < n1; ++r) rows_against<1>(x, ldx, M, K, w + r * K, y + r, ldy, next);
    }
  }
}

}  // namespace pdmesh::rows
#endif
