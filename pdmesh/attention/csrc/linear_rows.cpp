// y = x @ w.T for a few rows of x (decode batches, verified drafts), float32, AVX2 + FMA
// (sixteen lanes where there is AVX-512).
//
// Why not MKL: for 1 to 31 rows its sgemm neither streams the weights at the memory's
// speed (one row: ~10 GB/s of the ~22 GB/s two cores read) nor keeps a steady rate as
// the row count changes (12 rows took longer than 16 on our machines), and a decode
// batch takes every size as requests come and go. Here each thread owns a range of
// weight rows and reads it once, front to back; every weight load serves up to four rows
// of x, so few rows cost little more than the weights' read and more rows approach the
// FMA units' rate (docs/performance.md, section 12).
//
// The tile: 4 rows of x by NR rows of w (3 in AVX2's sixteen registers, 6 in AVX-512's
// thirty-two), one accumulator each over the shared dimension, then one horizontal sum
// each. A tile's NR weight rows are one contiguous run, and the run after it is prefetched
// into L2 while the tile computes, so the next tile's loads wait on no memory: on a 2-core
// Xeon the model's weights at 2-16 rows streamed 1.5-1.8x faster with AVX-512, and
// 1.3-1.6x in an AVX2-only build of the same code (docs/performance.md, section 37).
// Results differ from MKL's only in summation order. Built only where -march=native has
// AVX2 and FMA (module.cpp registers it then).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>

#include "vec_math.h"

#ifdef PDMESH_AVX2
namespace {

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

}  // namespace

at::Tensor linear_rows(const at::Tensor& x_in, const at::Tensor& w) {
  TORCH_CHECK(x_in.dim() == 2 && w.dim() == 2 && x_in.size(1) == w.size(1), "x [M, K] and w [N, K]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  // Rows may be strided (a column slice of a wider product); elements must be contiguous.
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), ldx = x.stride(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (N + kNR - 1) / kNR, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * kNR;
      // The run the next tile reads; the last tiles prefetch the weight's last run instead
      // (every prefetched address lies inside w).
      const float* next = wp + std::min(n + kNR, std::max<int64_t>(N - kNR, 0)) * K;
      if (N - n >= kNR) {
        rows_against<kNR>(xp, ldx, M, K, wp + n * K, yp + n, N, next);
      } else {
        for (int64_t r = n; r < N; ++r) rows_against<1>(xp, ldx, M, K, wp + r * K, yp + r, N, next);
      }
    }
  });
  return y;
}
#endif
