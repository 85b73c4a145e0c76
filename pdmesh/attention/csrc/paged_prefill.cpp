// Prefill attention straight over the paged KV pool (CPU, float32).
//
// A step's prefill chunks attend causally to their whole context: the cached prefix
// blocks and the chunk itself, whose K/V the backend has already written to the pool.
// torch's flash attention needed that context gathered into one tensor first and ran at
// about a third of the FMA units' rate on 64-token chunks over 512-token prefixes
// (docs/performance/log.md, section 18); here the K and V rows are read where they lie.
//
// A work item is one chunk's tile of query rows for one KV head: the tile's tokens times
// the query heads of that KV head's group, M = 4 vector widths of rows (64 with AVX-512,
// 32 with AVX2). Two passes, each a register-blocked product that needs no packing of K
// or V:
//  1. scores, transposed: S^T[key][row] = K[key] . Q[row], vectorised over the rows. The
//     tile's Q is packed once, head_dim-major, and every K element is broadcast to it, so
//     KR keys x 4 vectors of rows stay in registers over head_dim. Keys past a row's own
//     token are masked; the softmax then runs over keys for all rows at once (max, exp,
//     sum: element-wise over rows), in key order.
//  2. out[row] = sum over keys of P[key][row] * V[key]: PR rows x 4 vectors of head_dim in
//     registers over the keys, each V row loaded once for PR rows; a group of rows stops at
//     its last row's causal end. Rows are divided by their sum at the end.
// Every sum runs in a fixed order, so results do not depend on the thread count. Built
// only where -march=native has AVX2 and FMA (module.cpp registers it then); other dtypes,
// and head sizes that are not a multiple of the vector width, take the torch backend's path.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "vec_math.h"

#ifdef PDMESH_AVX2
namespace {

// Keys (scores) and rows (weighted sums) per register block: KR x 4 accumulators, 4
// vectors of Q (or of a V row) and a broadcast are 29 of AVX-512's 32 registers; with
// AVX2's 16 they are one over and the compiler reads an operand from memory (the AVX2
// build's speed was not measured: the machine of docs/performance/log.md §18 has AVX-512).
struct Vec : pdmesh::Widest {
  static constexpr int KR = REGS == 32 ? 6 : 3;
  static constexpr int PR = KR;
};

constexpr int M = 4 * Vec::W;  // query rows per tile

// st[k][0, M) = scale * (K row k . Q row r) for the n <= KR keys ``k``; ``qt`` is the
// tile's Q, [dim][M].
template <int N>
inline void scores(const float* qt, const float* const* k, int64_t dim, float scale, float* st) {
  Vec::R acc[N][4];
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = Vec::zero();
  for (int64_t d = 0; d < dim; ++d) {
    Vec::R q[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) q[j] = Vec::load(qt + d * M + j * Vec::W);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const Vec::R kv = Vec::set1(k[i][d]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[i][j] = Vec::fma(kv, q[j], acc[i][j]);
    }
  }
  const Vec::R s = Vec::set1(scale);
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) Vec::store(st + i * M + j * Vec::W, Vec::mul(acc[i][j], s));
}

// out rows r0 .. r0 + N (pointers) [c, c + NV * W) = sum over keys [0, kend) of
// P^T[key][r] * V row key, scaled by inv[r].
template <int N, int NV>
inline void values(const float* pt, int64_t r0, const float* const* v, int64_t kend, int64_t c,
                   const float* inv, float* const* out) {
  Vec::R acc[N][NV];
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = Vec::zero();
  for (int64_t t = 0; t < kend; ++t) {
    Vec::R row[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) row[j] = Vec::load(v[t] + c + j * Vec::W);
    const float* p = pt + t * M + r0;
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const Vec::R w = Vec::set1(p[i]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = Vec::fma(w, row[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    const Vec::R s = Vec::set1(inv[r0 + i]);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) Vec::store(out[i] + c + j * Vec::W, Vec::mul(acc[i][j], s));
  }
}

template <int N>
void scores_tail(int64_t n, const float* qt, const float* const* k, int64_t dim, float scale, float* st) {
  if constexpr (N > 0) {
    if (n == N) return scores<N>(qt, k, dim, scale, st);
    scores_tail<N - 1>(n, qt, k, dim, scale, st);
  }
}

template <int N>
void values_rows(int64_t n, int64_t nv, const float* pt, int64_t r0, const float* const* v, int64_t kend,
                 int64_t c, const float* inv, float* const* out) {
  if constexpr (N > 0) {
    if (n < N) return values_rows<N - 1>(n, nv, pt, r0, v, kend, c, inv, out);
    switch (nv) {
      case 4: return values<N, 4>(pt, r0, v, kend, c, inv, out);
      case 3: return values<N, 3>(pt, r0, v, kend, c, inv, out);
      case 2: return values<N, 2>(pt, r0, v, kend, c, inv, out);
      default: return values<N, 1>(pt, r0, v, kend, c, inv, out);
    }
  }
}

struct Item {
  int64_t seq, head, t0;  // the chunk, its KV head, the tile's first token in the chunk
};

// The buffers of one thread, grown as needed and kept across its items.
struct Scratch {
  std::vector<float> qt, st, inv;
  std::vector<const float*> k, v;
  std::vector<float*> out;
};

struct Shape {
  int64_t heads, group, dim, block_size, width, s_block, s_kv, s_tok, s_head;
};

// One tile: rows r = token * group + g of tokens [t0, t0 + tokens) for query heads
// head * group + g; ``start`` is the chunk's first row in q, ``prefix`` its context before it.
void tile(const Shape& sh, const float* qp, const float* kvp, const int64_t* table, int64_t start,
          int64_t prefix, int64_t head, int64_t t0, int64_t tokens, float scale, float* op, Scratch& s) {
  const int64_t rows = tokens * sh.group, kend = prefix + t0 + tokens, dim = sh.dim;
  s.qt.assign(dim * M, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = qp + ((start + t0 + r / sh.group) * sh.heads + head * sh.group + r % sh.group) * dim;
    for (int64_t d = 0; d < dim; ++d) s.qt[d * M + r] = src[d];
  }
  s.k.resize(kend);
  s.v.resize(kend);
  for (int64_t blk = 0, t = 0; t < kend; ++blk) {
    const float* base = kvp + table[blk] * sh.s_block + head * sh.s_head;
    for (int64_t o = 0; o < sh.block_size && t < kend; ++o, ++t) {
      s.k[t] = base + o * sh.s_tok;
      s.v[t] = s.k[t] + sh.s_kv;
    }
  }
  s.st.resize(kend * M);
  float* st = s.st.data();
  int64_t t = 0;
  for (; t + Vec::KR <= kend; t += Vec::KR) scores<Vec::KR>(s.qt.data(), s.k.data() + t, dim, scale, st + t * M);
  if (t < kend) scores_tail<Vec::KR - 1>(kend - t, s.qt.data(), s.k.data() + t, dim, scale, st + t * M);
  // Causal: row r sees keys up to prefix + t0 + r / group; only the tile's own keys mask.
  auto mask = [&](float value) {
    for (int64_t key = prefix + t0 + 1; key < kend; ++key)
      for (int64_t r = 0; r < rows; ++r)
        if (key > prefix + t0 + r / sh.group) st[key * M + r] = value;
  };
  const float ninf = -std::numeric_limits<float>::infinity();
  mask(ninf);
  Vec::R mx[4], sum[4];
  for (int j = 0; j < 4; ++j) mx[j] = Vec::set1(ninf), sum[j] = Vec::zero();
  for (int64_t key = 0; key < kend; ++key)
    for (int j = 0; j < 4; ++j) mx[j] = Vec::max(mx[j], Vec::load(st + key * M + j * Vec::W));
  for (int64_t key = 0; key < kend; ++key) {
    for (int j = 0; j < 4; ++j) {
      float* p = st + key * M + j * Vec::W;
      const Vec::R e = Vec::exp(Vec::sub(Vec::load(p), mx[j]));
      Vec::store(p, e);
      sum[j] = Vec::add(sum[j], e);
    }
  }
  mask(0.f);  // exp clamps its input, so a masked score came out as FLT_MIN: make it the zero it is
  s.inv.resize(M);
  for (int j = 0; j < 4; ++j) Vec::store(s.inv.data() + j * Vec::W, sum[j]);
  for (int64_t r = 0; r < M; ++r) s.inv[r] = 1.f / s.inv[r];
  s.out.resize(rows);
  for (int64_t r = 0; r < rows; ++r)
    s.out[r] = op + ((start + t0 + r / sh.group) * sh.heads + head * sh.group + r % sh.group) * dim;
  for (int64_t r0 = 0; r0 < rows; r0 += Vec::PR) {
    const int64_t n = std::min<int64_t>(Vec::PR, rows - r0);
    const int64_t last = prefix + t0 + (r0 + n - 1) / sh.group + 1;  // the group's causal end
    for (int64_t c = 0; c < dim; c += M)  // four vectors of head_dim at a time, then the rest
      values_rows<Vec::PR>(n, std::min<int64_t>(4, (dim - c) / Vec::W), st, r0, s.v.data(), last, c,
                           s.inv.data(), s.out.data() + r0);
  }
}

}  // namespace

int64_t paged_prefill_tile_rows() { return M; }
int64_t paged_prefill_lanes() { return Vec::W; }

void paged_prefill_(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_layer, const at::Tensor& tables,
                    const at::Tensor& spans, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "q must be a contiguous float32 [tokens, heads, head_dim]");
  TORCH_CHECK(out.sizes() == q.sizes() && out.is_contiguous() && out.scalar_type() == at::kFloat,
              "out must be a contiguous float32 tensor shaped like q");
  TORCH_CHECK(kv_layer.dim() == 5 && kv_layer.size(1) == 2 && kv_layer.stride(4) == 1 &&
              kv_layer.scalar_type() == at::kFloat,
              "kv_layer must be float32 [blocks, 2, block_size, kv_heads, head_dim] with contiguous head_dim");
  const int64_t heads = q.size(1), dim = q.size(2), kv_heads = kv_layer.size(3);
  TORCH_CHECK(heads % kv_heads == 0 && heads / kv_heads <= M, "query heads per KV head must be at most ", M);
  TORCH_CHECK(dim % Vec::W == 0, "head_dim must be a multiple of ", Vec::W);
  TORCH_CHECK(tables.scalar_type() == at::kLong && tables.dim() == 2 && tables.is_contiguous(), "tables: int64");
  TORCH_CHECK(spans.scalar_type() == at::kLong && spans.dim() == 2 && spans.size(1) == 3 &&
              spans.size(0) == tables.size(0) && spans.is_contiguous(),
              "spans: int64 [chunks, 3] (first row in q, rows, context length)");
  const Shape sh{heads, heads / kv_heads, dim, kv_layer.size(2), tables.size(1), kv_layer.stride(0),
                 kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3)};
  const int64_t* sp = spans.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t tokens = M / sh.group;
  std::vector<Item> items;
  for (int64_t p = 0; p < spans.size(0); ++p) {
    TORCH_CHECK(sp[3 * p] >= 0 && sp[3 * p + 1] >= 1 && sp[3 * p] + sp[3 * p + 1] <= q.size(0) &&
                sp[3 * p + 1] <= sp[3 * p + 2] &&
                sp[3 * p + 2] <= sh.width * sh.block_size, "span ", p, " lies outside q or its table");
    // The tiles with the most keys first, so that the last items taken are the cheap ones.
    for (int64_t t0 = (sp[3 * p + 1] - 1) / tokens * tokens; t0 >= 0; t0 -= tokens)
      for (int64_t h = 0; h < kv_heads; ++h) items.push_back({p, h, t0});
  }
  const float* qp = q.data_ptr<float>();
  const float* kvp = kv_layer.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  const int64_t n_items = static_cast<int64_t>(items.size());
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n_items), 1, [&](int64_t, int64_t) {
    Scratch s;
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) {
      const Item& it = items[i];
      const int64_t* span = sp + 3 * it.seq;
      const int64_t n = std::min(tokens, span[1] - it.t0);
      tile(sh, qp, kvp, tp + it.seq * sh.width, span[0], span[2] - span[1], it.head, it.t0, n, fscale, op, s);
    }
  });
}
#endif
