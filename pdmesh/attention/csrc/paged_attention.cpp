// Decode attention straight over the paged KV pool (CPU).
//
// One query token per sequence attends to its whole context, read block by block through
// its block table: no gathered or permuted copy of the context is ever made. The pool
// layer is [num_blocks, 2 (K/V), block_size, kv_heads, head_dim] with any strides but a
// contiguous head_dim. The query heads of one GQA group share every K/V row they load.
// Scores, softmax and the weighted sum of V are computed in float32 whatever the storage
// dtype. In float32 on AVX2 the scores take four tokens at a time (four FMA chains, each
// query load shared), both products run sixteen lanes wide where the CPU has AVX-512, and
// the softmax's exp is vectorised (vec_math.h); elsewhere the dot
// products use eight independent partial sums, which the compiler vectorises without
// reassociating anything. The kernel is bound by memory: K rows are prefetched eight
// tokens ahead and V rows four into L1 (docs/performance/log.md, section 10), both 64 tokens
// ahead into L2 (``kFarRows``, section 41; K's a head's part at a time, section 43), and
// sequences whose tables begin with the same blocks (a shared system prompt, served from
// the prefix cache) read those blocks' rows once for all of them (``plan``; section 16).
// Work items are (sequences, run of KV heads), taken by the threads in turn. A sliding layer
// (``window`` > 0) attends each sequence's last ``window`` tokens alone, and reads nothing
// before them; ``softcap`` > 0 passes every score through softcap * tanh(score / softcap)
// (Gemma 2) before the softmax.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "shared_rows.h"
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

using pdmesh::kFarRows;
using pdmesh::kIntoL2;
using pdmesh::prefetch_row;

// While scoring the quad at t, asks for the next quads' K rows (8 to 11 ahead, ``n`` floats
// each) into L1, all at once (spread over the heads like the far ones, they gained nothing).
template <typename T>
[[gnu::always_inline]] inline void prefetch_near_quads(const T* const* rows, int64_t t, int64_t t1, int64_t n) {
  if (t + 12 <= t1) {
    for (int64_t j = 8; j < 12; ++j) prefetch_row(rows[t + j], n);
  }
}

// Asks for one KV head's part (``n`` floats from ``offset``) of the K rows ``kFarRows`` ahead
// of the quad at t into L2, just before that head's products (shared_rows.h says why L2),
// rather than four whole rows at once per quad: 0-7% faster (docs/performance/log.md, section 43).
// Both helpers are always inlined: left to the compiler, the scoring loops it made around
// them ran 1.1-1.35x slower, with the same arithmetic and the same bits.
template <typename T>
[[gnu::always_inline]] inline void prefetch_far_part(const T* const* rows, int64_t t, int64_t t1, int64_t offset,
                                                     int64_t n) {
  if (t + kFarRows + 4 <= t1) {
    for (int64_t j = kFarRows; j < kFarRows + 4; ++j) prefetch_row<kIntoL2>(rows[t + j] + offset, n);
  }
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

// One sequence's rows of query heads and of scores, for the KV heads a work item handles.
struct Member {
  const float* q;  // [span * group][dim], KV head major
  float* scores;   // [span * group][len]
  float* acc;      // [span * group][dim]
  int64_t len;
};

#ifdef PDMESH_AVX2
// Scores of tokens [t0, t1)'s whole quads for a shared run, computed across query rows:
// each member's query heads for each KV head, transposed into tiles of V::W rows, meet a quad
// of K rows in ``dot4_lanes``, which gives every row exactly dot4's result (shared_rows.h).
// One K element then serves a whole register of rows, where dot4 serves one row per load and
// ends each (row, token) pair with horizontal sums.
template <class V, int L>
void scores_across_rows(const std::vector<Member>& members, const float* const* rows, int64_t t0, int64_t t1,
                        int64_t span, int64_t group, int64_t dim, int64_t s_head, float scale) {
  const int64_t n_rows = static_cast<int64_t>(members.size()) * group;  // per KV head
  const int64_t tiles = (n_rows + V::W - 1) / V::W;
  // Scratch kept per thread: this runs for every shared item of every layer's step.
  thread_local std::vector<float> qt;
  thread_local std::vector<float*> dst;
  qt.resize(span * tiles * dim * V::W);
  dst.assign(span * tiles * V::W, nullptr);
  const float* src[V::W];
  for (int64_t kh = 0; kh < span; ++kh) {
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t at = kh * tiles + tile, n = std::min<int64_t>(V::W, n_rows - tile * V::W);
      for (int64_t lane = 0; lane < n; ++lane) {
        const int64_t i = tile * V::W + lane, r = kh * group + i % group;
        const Member& m = members[i / group];
        src[lane] = m.q + r * dim;
        dst[at * V::W + lane] = m.scores + r * m.len;
      }
      pdmesh::transpose_rows<V>(src, static_cast<int>(n), dim, qt.data() + at * dim * V::W);
    }
  }
  alignas(64) float out[4 * V::W];
  for (int64_t t = t0; t + 4 <= t1; t += 4) {
    prefetch_near_quads(rows, t, t1, span * s_head);
    for (int64_t kh = 0; kh < span; ++kh) {
      prefetch_far_part(rows, t, t1, kh * s_head, s_head);
      const float* k[4] = {rows[t] + kh * s_head, rows[t + 1] + kh * s_head,
                           rows[t + 2] + kh * s_head, rows[t + 3] + kh * s_head};
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t at = kh * tiles + tile, n = std::min<int64_t>(V::W, n_rows - tile * V::W);
        pdmesh::dot4_lanes<V, L>(qt.data() + at * dim * V::W, k, dim, scale, out);
        for (int64_t lane = 0; lane < n; ++lane) {
          float* d = dst[at * V::W + lane] + t;
          for (int u = 0; u < 4; ++u) d[u] = out[u * V::W + lane];
        }
      }
    }
  }
}
#endif

// Scores of tokens [t0, t1) whose K rows ``rows[t]`` (the first KV head handled here) every
// member shares: each quad of rows is loaded once and stays in L1 while every member's
// query heads read it. A member's scores are the same bits whether its tokens are shared
// with others or not: each (query, key) pair is one dot4 or one dot, as the quads fall
// from t0 (a multiple of four) on.
template <typename T>
void scores_of(const std::vector<Member>& members, const T* const* rows, int64_t t0,
               int64_t t1, int64_t span, int64_t group, int64_t dim, int64_t s_head, float scale) {
  int64_t t = t0;
#ifdef PDMESH_AVX2
  if constexpr (std::is_same_v<T, float>) {
    if (members.size() > 1 && dim % 8 == 0) {  // a shared run: across the rows, dot4's bits
#ifdef __AVX512F__
      if (dim % 16 == 0) {
        scores_across_rows<pdmesh::V16, 16>(members, rows, t0, t1, span, group, dim, s_head, scale);
      } else {
        scores_across_rows<pdmesh::V16, 8>(members, rows, t0, t1, span, group, dim, s_head, scale);
      }
#else
      scores_across_rows<pdmesh::V8, 8>(members, rows, t0, t1, span, group, dim, s_head, scale);
#endif
      t = t0 + (t1 - t0) / 4 * 4;
    }
    if (dim % 8 == 0) {
      for (; t + 4 <= t1; t += 4) {
        prefetch_near_quads(rows, t, t1, span * s_head);
        for (int64_t kh = 0; kh < span; ++kh) {
          prefetch_far_part(rows, t, t1, kh * s_head, s_head);
          const float* k[4] = {rows[t] + kh * s_head, rows[t + 1] + kh * s_head,
                               rows[t + 2] + kh * s_head, rows[t + 3] + kh * s_head};
          for (const Member& m : members) {
            for (int64_t g = 0; g < group; ++g) {
              const int64_t r = kh * group + g;
              float o[4];
              pdmesh::dot4(m.q + r * dim, k, dim, o);
              for (int j = 0; j < 4; ++j) m.scores[r * m.len + t + j] = o[j] * scale;
            }
          }
        }
      }
    }
  }
#endif
  for (; t < t1; ++t) {
    for (int64_t kh = 0; kh < span; ++kh) {
      const T* k = rows[t] + kh * s_head;
      for (const Member& m : members) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t r = kh * group + g;
          m.scores[r * m.len + t] = dot(m.q + r * dim, k, dim) * scale;
        }
      }
    }
  }
}

#ifdef PDMESH_AVX2
// acc[0, N W) += sum over t of w[t] * v_t[0, N W) for one row: ``weighted_sum_rows`` with
// M = 1, the N accumulators held in registers over every token.
template <class V, int N>
inline void weighted_sum_regs(const float* w, const float* const* v, int64_t offset, int64_t t0,
                              int64_t t1, float* acc, bool prefetch, int64_t far) {
  pdmesh::weighted_sum_rows<V, N, 1>(&w, v, offset, t0, t1, &acc, prefetch, far);
}
#endif

// acc += w[t] * V row t over tokens [t0, t1), in token order; ``offset`` from a token's row
// pointer to this head's V. Only the first reader of a run of rows prefetches them, and it
// asks for ``far`` floats of each row from ``offset`` on ``kFarRows`` ahead (0: none).
template <typename T>
void weighted_sum(const float* w, const T* const* rows, int64_t offset, int64_t t0,
                  int64_t t1, float* acc, int64_t dim, bool prefetch, int64_t far) {
#ifdef PDMESH_AVX2
  if constexpr (std::is_same_v<T, float>) {
#ifdef __AVX512F__
    if (dim % 16 == 0) {  // 64 lanes in 4 of AVX-512's 32 registers
      for (int64_t c = 0; c < dim; c += 64) {
        const int64_t f = c ? 0 : far;  // the row's first chunk asks for it whole
        switch (std::min<int64_t>(64, dim - c) / 16) {
          case 4: weighted_sum_regs<pdmesh::V16, 4>(w, rows, offset + c, t0, t1, acc + c, prefetch, f); break;
          case 3: weighted_sum_regs<pdmesh::V16, 3>(w, rows, offset + c, t0, t1, acc + c, prefetch, f); break;
          case 2: weighted_sum_regs<pdmesh::V16, 2>(w, rows, offset + c, t0, t1, acc + c, prefetch, f); break;
          default: weighted_sum_regs<pdmesh::V16, 1>(w, rows, offset + c, t0, t1, acc + c, prefetch, f);
        }
      }
      return;
    }
#endif
    if (dim % 8 == 0) {  // 64 lanes at a time: 8 accumulators + a row + a weight fit AVX2's 16
      for (int64_t c = 0; c < dim; c += 64) {
        const int64_t n = std::min<int64_t>(64, dim - c) / 8, f = c ? 0 : far;
        const float* const* v = rows;
        switch (n) {
          case 8: weighted_sum_regs<pdmesh::V8, 8>(w, v, offset + c, t0, t1, acc + c, prefetch, f); break;
          case 4: weighted_sum_regs<pdmesh::V8, 4>(w, v, offset + c, t0, t1, acc + c, prefetch, f); break;
          default:
            for (int64_t t = t0; t < t1; ++t) axpy(w[t], v[t] + offset + c, acc + c, 8 * n);
        }
      }
      return;
    }
  }
#endif
  for (int64_t t = t0; t < t1; ++t) {
    if (prefetch && t + 4 < t1) prefetch_row(rows[t + 4] + offset, dim);
    if (far && t + kFarRows < t1) prefetch_row<kIntoL2>(rows[t + kFarRows] + offset, far);
    axpy(w[t], rows[t] + offset, acc, dim);
  }
}

#ifdef PDMESH_AVX2
// ``weighted_sum_rows`` for the last n <= M rows of a run, as one call.
template <class V, int N, int M>
inline void sum_rows_up_to(int n, const float* const* w, const float* const* v, int64_t offset, int64_t t0,
                           int64_t t1, float* const* acc, bool prefetch, int64_t far) {
  if (n == M) {
    pdmesh::weighted_sum_rows<V, N, M>(w, v, offset, t0, t1, acc, prefetch, far);
  } else if constexpr (M > 1) {
    sum_rows_up_to<V, N, M - 1>(n, w, v, offset, t0, t1, acc, prefetch, far);
  }
}

// A shared run's weighted sums of V, up to M query rows at a time (``weighted_sum_rows``):
// each V row is loaded once per M rows instead of once per row, from L2 as a rule (a
// 512-token prefix's V rows for one KV head are 128 KiB). Each row's bits are
// weighted_sum's. AVX-512 sums four rows over 64 lanes (4 x 4 accumulators of its 32
// registers); AVX2 two rows over 32 lanes (2 x 4 of its 16), each V row in two halves.
template <class V, int N, int M>
void values_across_rows(const std::vector<Member>& members, const float* const* rows, int64_t t0, int64_t t1,
                        int64_t span, int64_t group, int64_t dim, int64_t s_kv, int64_t s_head) {
  constexpr int64_t LANES = V::W * N;
  const int64_t n_rows = static_cast<int64_t>(members.size()) * group;
  for (int64_t kh = 0; kh < span; ++kh) {
    for (int64_t c = 0; c < dim; c += LANES) {
      for (int64_t i = 0; i < n_rows; i += M) {
        const float* w[M];
        float* acc[M];
        const int64_t n = std::min<int64_t>(M, n_rows - i);
        for (int64_t x = 0; x < n; ++x) {
          const Member& m = members[(i + x) / group];
          const int64_t r = kh * group + (i + x) % group;
          w[x] = &m.scores[r * m.len];
          acc[x] = &m.acc[r * dim + c];
        }
        const int64_t offset = s_kv + kh * s_head + c;
        const bool prefetch = i == 0;  // the first reader of this head's rows
        const int64_t far = prefetch && kh == 0 && c == 0 ? span * s_head : 0;  // every head's V, once
        sum_rows_up_to<V, N, M>(static_cast<int>(n), w, rows, offset, t0, t1, acc, prefetch, far);
      }
    }
  }
}
#endif

// Every member's weighted sums of V over tokens [t0, t1): row by row, so each row's
// accumulators stay in registers; rows of a shared run are read from memory by the first
// row and from cache by the others.
template <typename T>
void values_of(const std::vector<Member>& members, const T* const* rows, int64_t t0,
               int64_t t1, int64_t span, int64_t group, int64_t dim, int64_t s_kv, int64_t s_head) {
#ifdef PDMESH_AVX2
  if constexpr (std::is_same_v<T, float>) {
#ifdef __AVX512F__
    if (members.size() > 1 && dim % 64 == 0) {
      values_across_rows<pdmesh::V16, 4, 4>(members, rows, t0, t1, span, group, dim, s_kv, s_head);
      return;
    }
#else
    if (members.size() > 1 && dim % 32 == 0) {
      values_across_rows<pdmesh::V8, 4, 2>(members, rows, t0, t1, span, group, dim, s_kv, s_head);
      return;
    }
#endif
  }
#endif
  for (const Member& m : members) {
    for (int64_t kh = 0; kh < span; ++kh) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = kh * group + g;
        const bool first = &m == &members[0] && g == 0;  // the first reader of this head's rows
        const int64_t far = first && kh == 0 ? span * s_head : 0;  // every head's V, once
        weighted_sum(&m.scores[r * m.len], rows, s_kv + kh * s_head, t0, t1, &m.acc[r * dim], dim, first, far);
      }
    }
  }
}

// A work item: some sequences that share their first ``shared`` tokens' blocks (one
// sequence and nothing shared, most often), and the KV heads [h0, h0 + span).
struct Item {
  int64_t first, count;  // into the member order
  int64_t shared;        // a multiple of four
  int64_t h0;
};

// Groups the batch by its first block; a group shares the blocks every member's table has
// in common, full blocks only (prefix caching shares nothing else). Sequences that share a
// system prompt then read its K/V once per item instead of once each: decode attention is
// bound by memory, and a batch of 64 over four shared 512-token prefixes reads 5x fewer
// bytes (its attention per decode step: 13.6 -> 9.0-9.5 ms, docs/performance/log.md §16).
struct Plan {
  std::vector<int64_t> order;  // sequences, grouped
  std::vector<Item> items;
  int64_t span;                // KV heads per item
};

Plan plan(const int64_t* tp, const int64_t* lp, int64_t batch, int64_t width, int64_t block_size,
          int64_t kv_heads, int threads, bool windowed) {
  Plan p;
  std::vector<int64_t>& order = p.order;
  order.resize(batch);
  for (int64_t b = 0; b < batch; ++b) order[b] = b;
  auto first = [&](int64_t b) { return lp[b] >= block_size ? tp[b * width] : -1 - b; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return first(a) < first(b); });
  struct Group { int64_t begin, end, shared; };
  std::vector<Group> groups;
  for (int64_t i = 0; i < batch;) {
    int64_t j = i + 1;
    while (j < batch && first(order[j]) == first(order[i])) ++j;
    int64_t blocks = lp[order[i]] / block_size;
    for (int64_t k = i + 1; k < j; ++k) {
      const int64_t a = order[i], b = order[k];
      int64_t n = 0, lim = std::min(blocks, lp[b] / block_size);
      while (n < lim && tp[a * width + n] == tp[b * width + n]) ++n;
      blocks = n;
    }
    groups.push_back({i, j, j - i > 1 ? (blocks * block_size) / 4 * 4 : 0});
    i = j;
  }
  // Enough items to keep every thread busy: all KV heads of a group in one item while
  // there are plenty of groups (each token row read front to back), else one KV head
  // each, and groups split into chunks (each chunk reads the shared part once).
  const int64_t n_groups = static_cast<int64_t>(groups.size());
  const int64_t span = p.span = n_groups >= 2 * threads ? kv_heads : 1;
  const int64_t per_group = kv_heads / span;
  const int64_t want = 4 * static_cast<int64_t>(threads);
  const int64_t chunks_each = std::max<int64_t>(1, (want + n_groups * per_group - 1) / (n_groups * per_group));
  std::vector<Item>& items = p.items;
  for (const Group& grp : groups) {
    const int64_t size = grp.end - grp.begin;
    const int64_t chunk = std::max<int64_t>(1, (size + chunks_each - 1) / chunks_each);
    for (int64_t c = grp.begin; c < grp.end; c += chunk) {
      const int64_t count = std::min(chunk, grp.end - c);
      const int64_t shared = count > 1 && !windowed ? grp.shared : 0;  // a window starts past a shared prefix
      for (int64_t h = 0; h < per_group; ++h) items.push_back({c, count, shared, h * span});
    }
  }
  return p;
}

template <typename T>
void decode(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& tables,
            const at::Tensor& lens, double scale, int64_t window, double softcap, at::Tensor& out) {
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
  const int threads = at::get_num_threads();
  const Plan work = plan(tp, lp, batch, width, block_size, kv_heads, threads, window > 0);
  // The first token each sequence attends: past the window's start on a sliding layer.
  auto start = [&](int64_t b) { return window > 0 ? std::max<int64_t>(0, lp[b] - window) : int64_t{0}; };
  const float cap = static_cast<float>(softcap);
  const std::vector<int64_t>& order = work.order;
  const std::vector<Item>& items = work.items;
  const int64_t span = work.span;
  const int64_t nq = span * group;  // query heads per member in an item, KV head major
  std::atomic<int64_t> next{0};
  const int64_t n_items = static_cast<int64_t>(items.size());

  // Items are taken in turn: groups differ in size, and a static split of a few unequal
  // items would leave a thread idle.
  at::parallel_for(0, std::min<int64_t>(threads, n_items), 1, [&](int64_t, int64_t) {
    std::vector<float> qf, acc, scores;
    std::vector<Member> members, one(1);
    std::vector<const T*> rows;
    std::vector<int64_t> roff;
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) {
      const Item& it = items[i];
      int64_t total = 0;
      for (int64_t k = 0; k < it.count; ++k) total += lp[order[it.first + k]] - start(order[it.first + k]);
      qf.resize(it.count * nq * dim);
      acc.assign(it.count * nq * dim, 0.f);
      scores.resize(nq * total);
      members.clear();
      for (int64_t k = 0, offset = 0; k < it.count; ++k) {
        const int64_t b = order[it.first + k];
        const int64_t len = lp[b] - start(b);
        members.push_back({qf.data() + k * nq * dim, scores.data() + offset, acc.data() + k * nq * dim, len});
        offset += nq * len;
        for (int64_t r = 0; r < nq; ++r) {
          const T* src = qp + (b * heads + it.h0 * group + r) * dim;
          for (int64_t x = 0; x < dim; ++x) qf[(k * nq + r) * dim + x] = static_cast<float>(src[x]);
        }
      }
      // Every member's row pointers, once: token t's K row of the first KV head here.
      rows.resize(total);
      roff.resize(it.count);
      for (int64_t k = 0, offset = 0; k < it.count; ++k) {
        const int64_t b = order[it.first + k], first = start(b), len = lp[b];
        const T** dst = rows.data() + offset - first;
        roff[k] = offset;
        offset += len - first;
        // Block by block from the window's first token: no division per token.
        for (int64_t blk = first / block_size, t = first, o = first % block_size; t < len; ++blk, o = 0) {
          const T* base = kvp + tp[b * width + blk] * s_block + it.h0 * s_head;
          for (; o < block_size && t < len; ++o, ++t) dst[t] = base + o * s_tok;
        }
      }
      const T* const* shared_rows = rows.data() + roff[0];  // the shared blocks are in every table
      if (it.shared > 0) scores_of(members, shared_rows, 0, it.shared, span, group, dim, s_head, fscale);
      for (int64_t k = 0; k < it.count; ++k) {
        one[0] = members[k];
        scores_of(one, rows.data() + roff[k], it.shared, members[k].len, span, group, dim, s_head, fscale);
        for (int64_t r = 0; r < nq; ++r) {
          float* row = &members[k].scores[r * members[k].len];
          if (cap > 0)
            for (int64_t t = 0; t < members[k].len; ++t) row[t] = std::tanh(row[t] / cap) * cap;  // transformers' order
          softmax_row(row, members[k].len);
        }
      }
      if (it.shared > 0) values_of(members, shared_rows, 0, it.shared, span, group, dim, s_kv, s_head);
      for (int64_t k = 0; k < it.count; ++k) {
        one[0] = members[k];
        values_of(one, rows.data() + roff[k], it.shared, members[k].len, span, group, dim, s_kv, s_head);
        T* dst = op + (order[it.first + k] * heads + it.h0 * group) * dim;
        for (int64_t x = 0; x < nq * dim; ++x) dst[x] = static_cast<T>(members[k].acc[x]);
      }
    }
  });
}

}  // namespace

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& kv_layer, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, double scale, int64_t window, double softcap) {
  TORCH_CHECK(window >= 0 && softcap >= 0, "window and softcap: 0 (none) or positive");
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous [batch, heads, head_dim]");
  TORCH_CHECK(kv_layer.dim() == 5 && kv_layer.size(1) == 2 && kv_layer.stride(4) == 1,
              "kv_layer must be [blocks, 2, block_size, kv_heads, head_dim] with contiguous head_dim");
  TORCH_CHECK(kv_layer.scalar_type() == q.scalar_type(), "q and the KV pool must share a dtype");
  TORCH_CHECK(q.size(1) % kv_layer.size(3) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous(), "block_tables: int64");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && seq_lens.numel() == q.size(0), "seq_lens: int64 [batch]");
  at::Tensor out = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    decode<scalar_t>(q, kv_layer, block_tables, seq_lens, scale, window, softcap, out);
  });
  return out;
}
