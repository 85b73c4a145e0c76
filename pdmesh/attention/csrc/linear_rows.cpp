// y = x @ w.T for a few rows of x (decode batches, verified drafts), float32, AVX2 + FMA
// (sixteen lanes where there is AVX-512).
//
// Why not MKL: for 1 to 31 rows its sgemm neither streams the weights at the memory's
// speed (one row: ~10 GB/s of the ~22 GB/s two cores read) nor keeps a steady rate as
// the row count changes (12 rows took longer than 16 on our machines), and a decode
// batch takes every size as requests come and go. Here each thread owns a range of
// weight rows and reads it once, front to back; every weight load serves up to four rows
// of x, so few rows cost little more than the weights' read and more rows approach the
// FMA units' rate (docs/performance/log.md, section 12).
//
// The tile: 4 rows of x by NR rows of w (3 in AVX2's sixteen registers, 6 in AVX-512's
// thirty-two), one accumulator each over the shared dimension, then one horizontal sum
// each. A tile's NR weight rows are one contiguous run, and the run after it is prefetched
// into L2 while the tile computes, so the next tile's loads wait on no memory: on a 2-core
// Xeon the model's weights at 2-16 rows streamed 1.5-1.8x faster with AVX-512, and
// 1.3-1.6x in an AVX2-only build of the same code (docs/performance/log.md, section 37).
// Results differ from MKL's only in summation order. Built only where -march=native has
// AVX2 and FMA (module.cpp registers it then).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>

#include "row_tiles.h"
#include "vec_math.h"

#ifdef PDMESH_AVX2
using pdmesh::rows::kNR;
using pdmesh::rows::rows_against;

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
