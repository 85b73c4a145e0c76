// y = x @ w.T for a few rows of x (decode batches, verified drafts), float32, AVX2 + FMA.
//
// Why not MKL: for 1 to 31 rows its sgemm neither streams the weights at the memory's
// speed (one row: ~10 GB/s of the ~22 GB/s two cores read) nor keeps a steady rate as
// the row count changes (12 rows took longer than 16 on our machines), and a decode
// batch takes every size as requests come and go. Here each thread owns a range of
// weight rows and reads it once, front to back; every weight load serves up to four rows
// of x, so few rows cost little more than the weights' read and more rows approach the
// FMA units' rate (docs/performance.md, section 12).
//
// The tile: 4 rows of x by 3 rows of w, twelve 8-lane accumulators over the shared
// dimension, then one horizontal sum each. Results differ from MKL's only in summation
// order. Built only where -march=native has AVX2 and FMA (module.cpp registers it then).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>

#include "vec_math.h"

#ifdef PDMESH_AVX2
namespace {

template <int MR, int NR>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  // Spill through an array written in unrolled loops: indexing the accumulators in the
  // reduction loop below made GCC keep them in memory inside the hot loop above.
  alignas(32) float lanes[MR][NR][8];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) _mm256_store_ps(lanes[i][j], acc[i][j]);
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = pdmesh::hsum8(_mm256_load_ps(lanes[i][j]));
      for (int64_t kk = k; kk < K; ++kk) s += x[i * ldx + kk] * w[j * K + kk];
      y[i * ldy + j] = s;
    }
  }
}

// Every row of x against NR consecutive rows of w.
template <int NR>
void rows_against(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w, float* y, int64_t N) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4, NR>(x + m * ldx, ldx, w, K, y + m * N, N);
  switch (M - m) {
    case 3: tile<3, NR>(x + m * ldx, ldx, w, K, y + m * N, N); break;
    case 2: tile<2, NR>(x + m * ldx, ldx, w, K, y + m * N, N); break;
    case 1: tile<1, NR>(x + m * ldx, ldx, w, K, y + m * N, N); break;
    default: break;
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
  constexpr int64_t kNR = 3;
  at::parallel_for(0, (N + kNR - 1) / kNR, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * kNR;
      switch (std::min(kNR, N - n)) {
        case 3: rows_against<3>(xp, ldx, M, K, wp + n * K, yp + n, N); break;
        case 2: rows_against<2>(xp, ldx, M, K, wp + n * K, yp + n, N); break;
        default: rows_against<1>(xp, ldx, M, K, wp + n * K, yp + n, N); break;
      }
    }
  });
  return y;
}
#endif
