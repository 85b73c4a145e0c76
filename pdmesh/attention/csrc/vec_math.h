// AVX2 + FMA helpers the float32 kernels share: exp over eight lanes, and four dot
// products at once. Compiled only where the build's -march=native has both; the kernels
// keep a portable path for everything else (other dtypes, head sizes, CPUs).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#define PDMESH_AVX2 1
#include <immintrin.h>

#include <cstdint>

namespace pdmesh {

// e^x for eight floats: Cody-Waite range reduction by ln 2 and a degree-6 polynomial
// (the Cephes expf coefficients), within 2 ulp of expf. Inputs are clamped to
// [ln FLT_MIN, ln FLT_MAX], so anything below gives FLT_MIN (~1e-38) rather than a
// denormal or zero: softmax weights that small vanish beside the maximum's 1.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447505531f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[j] = q . k[j] for four rows k[0..3] of length d (a multiple of 8): four independent
// FMA chains, and each load of q serves all four rows; sixteen lanes at a time where the
// CPU has AVX-512 and d allows (docs/performance.md, section 18).
inline void dot4(const float* q, const float* const k[4], int64_t d, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#ifdef __AVX512F__
  if (d % 16 == 0) {  // sixteen lanes, then each accumulator's halves added into eight
    __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
    for (int64_t i = 0; i < d; i += 16) {
      const __m512 qv = _mm512_loadu_ps(q + i);
      b0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[0] + i), b0);
      b1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[1] + i), b1);
      b2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[2] + i), b2);
      b3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[3] + i), b3);
    }
    a0 = _mm256_add_ps(_mm512_castps512_ps256(b0), _mm512_extractf32x8_ps(b0, 1));
    a1 = _mm256_add_ps(_mm512_castps512_ps256(b1), _mm512_extractf32x8_ps(b1, 1));
    a2 = _mm256_add_ps(_mm512_castps512_ps256(b2), _mm512_extractf32x8_ps(b2, 1));
    a3 = _mm256_add_ps(_mm512_castps512_ps256(b3), _mm512_extractf32x8_ps(b3, 1));
    d = 0;
  }
#endif
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[0] + i), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[1] + i), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[2] + i), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[3] + i), a3);
  }
  // Lane-wise pair sums, then the two 128-bit halves: [sum a0, sum a1, sum a2, sum a3].
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
}

#ifdef __AVX512F__
// exp8 over sixteen lanes: the same reduction, polynomial and clamps, so a lane's result
// has the same bits as exp8's for the same input.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3365447505531f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif

}  // namespace pdmesh

#endif
