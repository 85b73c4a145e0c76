// Decode attention straight over the paged KV pool (CPU).
//
// One query token per sequence attends to its whole context, read block by block through
// its block table: no gathered or permuted copy of the context is ever made. The pool
// layer is [num_blocks, 2 (K/V), block_size, kv_heads, head_dim] with any strides but a
// contiguous head_dim. The query heads of one GQA group share every K/V row they load.
// Scores, softmax and the weighted sum of V are computed in float32 whatever the storage
// dtype. In float32 on AVX2 the scores take four tokens at a time (four FMA chains, each
// query load shared) and the softmax's exp is vectorised (vec_math.h); elsewhere the dot
// products use eight independent partial sums, which the compiler vectorises without
// reassociating anything. The kernel is bound by memory: K rows are prefetched eight
// tokens ahead and V rows four (docs/performance.md, section 10). Work is split over sequences (each reads its blocks front to back, all heads of a token row at
// once) or, when there are fewer sequences than threads can use, over (sequence, kv head).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec_math.h"

namespace {

template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += q[i + j] * static_cast<float>(k[i + j]);
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < d; ++i) s += q[i] * static_cast<float>(k[i]);
  return s;
}

template <typename T>
inline void axpy(float a, const T* v, float* out, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] += a * static_cast<float>(v[i]);
}

// Asks for the cache lines of one token's row of ``n`` elements ahead of use: a block's
// rows cross 4 KiB pages, where the hardware prefetcher stops, and blocks are scattered.
template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(c + off);
}

// Softmax of one row of scores, in place.
inline void softmax_row(float* s, int64_t n) {
  int64_t t = 0;
  float m = -std::numeric_limits<float>::infinity(), sum = 0.f;
#ifdef PDMESH_AVX2
  __m256 vm = _mm256_set1_ps(m);
  for (; t + 8 <= n; t += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + t));
  m = pdmesh::hmax8(vm);
#endif
  for (; t < n; ++t) m = std::max(m, s[t]);
  t = 0;
#ifdef PDMESH_AVX2
  const __m256 shift = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  for (; t + 8 <= n; t += 8) {
    const __m256 e = pdmesh::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift));
    _mm256_storeu_ps(s + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  sum = pdmesh::hsum8(vsum);
#endif
  for (; t < n; ++t) {
    s[t] = std::exp(s[t] - m);
    sum += s[t];
  }
  const float inv = 1.f / sum;
  for (t = 0; t < n; ++t) s[t] *= inv;
}

// scores[r][t] = scale * q_r . k_t for the query heads of one sequence's KV heads; rows[t]
// points at token t's K row of the first KV head handled here.
template <typename T>
void scores_of(const float* qf, const std::vector<const T*>& rows, int64_t span, int64_t group,
               int64_t dim, int64_t s_head, float scale, float* scores) {
  const int64_t len = static_cast<int64_t>(rows.size());
  int64_t t = 0;
#ifdef PDMESH_AVX2
  if constexpr (std::is_same_v<T, float>) {
    if (dim % 8 == 0) {
      // Four tokens at a time: their rows stay in L1 while every query head reads them.
      for (; t + 4 <= len; t += 4) {
        if (t + 12 <= len) {
          for (int64_t j = 8; j < 12; ++j) prefetch_row(rows[t + j], span * s_head);
        }
        for (int64_t kh = 0; kh < span; ++kh) {
          const float* k[4] = {rows[t] + kh * s_head, rows[t + 1] + kh * s_head,
                               rows[t + 2] + kh * s_head, rows[t + 3] + kh * s_head};
          for (int64_t g = 0; g < group; ++g) {
            const int64_t r = kh * group + g;
            float o[4];
            pdmesh::dot4(qf + r * dim, k, dim, o);
            for (int j = 0; j < 4; ++j) scores[r * len + t + j] = o[j] * scale;
          }
        }
      }
    }
  }
#endif
  for (; t < len; ++t) {
    for (int64_t kh = 0; kh < span; ++kh) {
      const T* k = rows[t] + kh * s_head;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = kh * group + g;
        scores[r * len + t] = dot(qf + r * dim, k, dim) * scale;
      }
    }
  }
}

template <typename T>
void decode(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& tables,
            const at::Tensor& lens, double scale, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = kv.size(2), kv_heads = kv.size(3);
  const int64_t group = heads / kv_heads, width = tables.size(1);
  const int64_t s_block = kv.stride(0), s_kv = kv.stride(1), s_tok = kv.stride(2), s_head = kv.stride(3);
  const T* qp = q.data_ptr<T>();
  const T* kvp = kv.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const float fscale = static_cast<float>(scale);
  // A work item is one sequence's run of KV heads: all of them when there are enough
  // sequences to keep every thread busy (each token's K/V row is then read front to back),
  // one head each otherwise (a lone sequence still uses every thread).
  const int64_t span = batch >= 2 * at::get_num_threads() ? kv_heads : 1;
  const int64_t per_seq = kv_heads / span;

  at::parallel_for(0, batch * per_seq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(span * group * dim), acc(span * group * dim), scores;
    std::vector<const T*> rows;
    for (int64_t work = begin; work < end; ++work) {
      const int64_t b = work / per_seq, h0 = (work % per_seq) * span, len = lp[b];
      const int64_t nq = span * group;  // query heads handled here, kv head major
      scores.resize(nq * len);
      rows.resize(len);
      for (int64_t t = 0; t < len; ++t) {
        rows[t] = kvp + tp[b * width + t / block_size] * s_block + (t % block_size) * s_tok + h0 * s_head;
      }
      for (int64_t r = 0; r < nq; ++r) {
        const T* src = qp + (b * heads + h0 * group + r) * dim;
        for (int64_t i = 0; i < dim; ++i) qf[r * dim + i] = static_cast<float>(src[i]);
      }
      scores_of(qf.data(), rows, span, group, dim, s_head, fscale, scores.data());
      for (int64_t r = 0; r < nq; ++r) softmax_row(&scores[r * len], len);
      // Weighted sum of V, token rows front to back.
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        if (t + 4 < len) prefetch_row(rows[t + 4] + s_kv, span * s_head);
        for (int64_t kh = 0; kh < span; ++kh) {
          const T* v = rows[t] + s_kv + kh * s_head;
          for (int64_t g = 0; g < group; ++g) {
            const int64_t r = kh * group + g;
            axpy(scores[r * len + t], v, &acc[r * dim], dim);
          }
        }
      }
      for (int64_t r = 0; r < nq; ++r) {
        T* dst = op + (b * heads + h0 * group + r) * dim;
        for (int64_t i = 0; i < dim; ++i) dst[i] = static_cast<T>(acc[r * dim + i]);
      }
    }
  });
}

}  // namespace

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& kv_layer, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous [batch, heads, head_dim]");
  TORCH_CHECK(kv_layer.dim() == 5 && kv_layer.size(1) == 2 && kv_layer.stride(4) == 1,
              "kv_layer must be [blocks, 2, block_size, kv_heads, head_dim] with contiguous head_dim");
  TORCH_CHECK(kv_layer.scalar_type() == q.scalar_type(), "q and the KV pool must share a dtype");
  TORCH_CHECK(q.size(1) % kv_layer.size(3) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous(), "block_tables: int64");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && seq_lens.numel() == q.size(0), "seq_lens: int64 [batch]");
  at::Tensor out = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    decode<scalar_t>(q, kv_layer, block_tables, seq_lens, scale, out);
  });
  return out;
}
