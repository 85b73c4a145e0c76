// AVX2 + FMA helpers the float32 kernels share: exp, four dot products at once, and the
// vector types the kernels template over (sixteen lanes where there is AVX-512 too).
// Compiled only where the build's -march=native has both; the kernels keep a portable
// path for everything else (other dtypes, head sizes, CPUs).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#define PDMESH_AVX2 1
#include <immintrin.h>

#include <cstdint>

namespace pdmesh {

// e^x: Cody-Waite range reduction by ln 2 and a degree-6 polynomial (the Cephes expf
// coefficients), within 2 ulp of expf. Inputs are clamped to [ln FLT_MIN, ln FLT_MAX], so
// anything below gives FLT_MIN (~1e-38) rather than a denormal or zero: softmax weights
// that small vanish beside the maximum's 1. exp8 and exp16 are the same steps on eight and
// sixteen lanes, so a lane has the same bits in both.
namespace expf_consts {
constexpr float kHi = 88.3762626647949f, kLo = -87.3365447505531f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace expf_consts

inline __m256 exp8(__m256 x) {
  using namespace expf_consts;
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(kHi)), _mm256_set1_ps(kLo));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP[i]));
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
// CPU has AVX-512 and d allows (docs/performance/log.md, section 18).
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
inline __m512 exp16(__m512 x) {
  using namespace expf_consts;
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(kHi)), _mm512_set1_ps(kLo));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kP[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif

// One float32 vector register and the operations the kernels template over: V8 is AVX2's
// eight lanes, V16 AVX-512's sixteen, and ``Widest`` the widest this build has.
struct V8 {
  using R = __m256;
  static constexpr int W = 8;
  static constexpr int REGS = 16;
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R exp(R x) { return exp8(x); }
  static float sum(R v) { return hsum8(v); }
};

#ifdef __AVX512F__
struct V16 {
  using R = __m512;
  static constexpr int W = 16;
  static constexpr int REGS = 32;
  static R zero() { return _mm512_setzero_ps(); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R exp(R x) { return exp16(x); }
  static float sum(R v) { return _mm512_reduce_add_ps(v); }
};
using Widest = V16;
#else
using Widest = V8;
#endif

}  // namespace pdmesh

#endif
