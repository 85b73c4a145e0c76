// Fused elementwise ops of a decoder layer (CPU, float32).
//
// Unfused, RMSNorm is five passes over the hidden states (square, mean, rsqrt, two
// multiplies) and rotary embedding six (negate, concatenate, two multiplies, an add, and
// the copies between): in a 512-token prefill on two AVX2 cores they took about a third
// of the step, more than attention (docs/performance/log.md). Here each is one pass per row,
// computed in float32 in the same order of operations as the reference formulas; only the
// summation order of the mean of squares (and FMA contraction) differs, a few ulps.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "vec_math.h"

namespace {

// Rows per parallel task: enough work that a thread's wake-up is amortised.
constexpr int64_t kGrain = 16;

}  // namespace

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, for a [rows, dim] float32 x
// whose rows are contiguous (any row stride).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "rms_norm: x must be a float32 [rows, dim] tensor with contiguous rows");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == at::kFloat &&
                  weight.numel() == x.size(1), "rms_norm: weight must be float32 [dim]");
  const int64_t rows = x.size(0), dim = x.size(1), stride = x.stride(0);
  at::Tensor out = at::empty({rows, dim}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * stride;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int64_t i = 0;
      for (; i + 8 <= dim; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += row[i + j] * row[i + j];
      }
      float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; i < dim; ++i) ss += row[i] * row[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + feps);
      float* o = op + r * dim;
      for (int64_t k = 0; k < dim; ++k) o[k] = wp[k] * (row[k] * inv);
    }
  });
  return out;
}

// Rotary embedding in place, "rotate half" (GPT-NeoX) form, over x [tokens, heads,
// head_dim] float32 with any strides: x = x * cos + rotate_half(x) * sin, where cos and
// sin are [tokens, head_dim] with contiguous rows.
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "rope_: x must be float32 [tokens, heads, dim]");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  TORCH_CHECK(dim % 2 == 0, "rope_: head_dim must be even");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == tokens && cos.size(1) == dim && cos.stride(1) == 1 &&
                  sin.sizes() == cos.sizes() && sin.strides() == cos.strides() &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rope_: cos and sin must be float32 [tokens, head_dim] with contiguous rows");
  const int64_t st = x.stride(0), sh = x.stride(1), sd = x.stride(2), sc = cos.stride(0);
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * sc;
      const float* s = sp + t * sc;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = xp + t * st + h * sh;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i * sd], b = v[(i + half) * sd];
          v[i * sd] = a * c[i] + (-b) * s[i];
          v[(i + half) * sd] = b * c[i + half] + a * s[i + half];
        }
      }
    }
  });
}

namespace {

// out[i] = silu(g[i]) * u[i] for i < n (out may be g). silu(x) = x / (1 + e^-x), as torch
// computes it; e^-x is vectorised on AVX2 (vec_math.h), within 2 ulp of expf.
inline void silu_mul_span(const float* g, const float* u, float* out, int64_t n) {
  int64_t i = 0;
#ifdef PDMESH_AVX2
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = pdmesh::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) out[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

}  // namespace

// gate = silu(gate) * up, in place, for float32 tensors of the same shape and strides with
// no gaps (the row-major products of long prefill chunks and the transposed ones of
// decode alike): one pass instead of two, and no temporary.
void silu_mul_(at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.scalar_type() == at::kFloat && up.scalar_type() == at::kFloat, "silu_mul_: float32 only");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.strides() == up.strides() && gate.is_non_overlapping_and_dense(),
              "silu_mul_: gate and up must share shape and dense strides");
  float* g = gate.data_ptr<float>();
  const float* u = up.data_ptr<float>();
  at::parallel_for(0, gate.numel(), 4096, [&](int64_t begin, int64_t end) {
    silu_mul_span(g + begin, u + begin, g + begin, end - begin);
  });
}

// silu(gate) * up into a new [rows, n] tensor, from one product's [rows, 2n] output whose
// row holds gate then up (the fused gate/up weight, ``GatedMLP.gate_up``): the halves are
// strided, so the in-place form above cannot take them, and the down product wants its
// input contiguous anyway.
at::Tensor silu_mul_halves(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.stride(1) == 1 &&
                  gate_up.size(1) % 2 == 0,
              "silu_mul_halves: gate_up must be float32 [rows, 2n] with contiguous rows");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2, ld = gate_up.stride(0);
  at::Tensor out = at::empty({rows, n}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows * n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {  // the part of each row in [begin, end)
      const int64_t r = i / n, c = i - r * n, len = std::min(n - c, end - i);
      silu_mul_span(g + r * ld + c, g + r * ld + n + c, o + i, len);
      i += len;
    }
  });
  return out;
}
