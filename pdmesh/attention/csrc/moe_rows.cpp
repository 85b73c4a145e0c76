// A mixture-of-experts feed-forward for the few tokens of a decode step, float32, AVX2 +
// FMA: out[t] = sum over t's chosen experts e, in ascending e, of w(t, e) * down_e(silu(gate_e
// x_t) * up_e x_t).
//
// Why: at decode sizes each expert has a handful of rows (16 tokens x 8 of 64 experts: ~2
// rows each), so a per-expert product in Python pays its dispatch ~100 times per layer and
// MKL's small-M sgemm runs far from the memory's speed. Here every active expert's weight
// tiles are one work list shared by the threads (the few-row tiles of row_tiles.h: each
// weight row read once, for all of that expert's rows), for the gate/up product and again
// for the down product; the router's pairs come sorted by expert (moe.py,
// ``sort_by_expert``), and each token's outputs are summed in ascending expert order, as
// transformers sums them (docs/moe.md). Steps with many rows per expert take the experts
// one by one instead (``experts_one_by_one``).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <vector>

#include "row_tiles.h"
#include "vec_math.h"

at::Tensor silu_mul_halves(const at::Tensor& gate_up);

#ifdef PDMESH_AVX2
namespace {

using pdmesh::rows::kNR;
using pdmesh::rows::weight_rows;

constexpr int64_t kRowsPerItem = 4 * kNR;  // weight rows per work item: a few tiles

struct Item {
  int64_t expert, first_row;  // rows [first_row, first_row + kRowsPerItem) of that expert's weight
};

// Every active expert's weight rows [0, n), in pieces the threads share.
std::vector<Item> items_of(const std::vector<int64_t>& bounds, int64_t experts, int64_t n) {
  std::vector<Item> items;
  for (int64_t e = 0; e < experts; ++e) {
    if (bounds[e + 1] == bounds[e]) continue;
    for (int64_t r = 0; r < n; r += kRowsPerItem) items.push_back({e, r});
  }
  return items;
}

// y[rows of e, :] = x[rows of e] @ w[e].T for every active e; w is [E, N, K], x [P, K], y [P, N].
void expert_products(const float* x, int64_t K, const float* w, int64_t N, float* y,
                     const std::vector<int64_t>& bounds, const std::vector<Item>& items) {
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Item& it = items[i];
      const int64_t start = bounds[it.expert], rows = bounds[it.expert + 1] - start;
      const float* we = w + it.expert * N * K;
      const Item& after = items[std::min<int64_t>(i + 1, static_cast<int64_t>(items.size()) - 1)];
      const float* next = w + (after.expert * N + after.first_row) * K;
      weight_rows(x + start * K, K, rows, K, we, it.first_row, std::min(N, it.first_row + kRowsPerItem),
                  y + start * N, N, next);
    }
  });
}

// The same for steps whose experts each have many rows (a prefill chunk): one expert at a
// time, its products parallel across its weight rows, and its outputs added into ``out``
// before the next expert's (ascending, as above). The intermediates are one expert's rows,
// not the step's pairs: a 2,048-token chunk's [P, H] copies are 32 MiB each; one expert at
// a time ran at the same speed in a fraction of the memory (docs/moe.md).
void experts_one_by_one(const float* x, const int64_t* ord, const float* wts, const float* wgu, const float* wd,
                        int64_t H, int64_t I, int64_t top_k, const std::vector<int64_t>& bounds, float* out,
                        const at::TensorOptions& options) {
  const int64_t E = static_cast<int64_t>(bounds.size()) - 1, I2 = 2 * I;
  int64_t most = 0;
  for (int64_t e = 0; e < E; ++e) most = std::max(most, bounds[e + 1] - bounds[e]);
  at::Tensor xs = at::empty({most, H}, options), gate_up = at::empty({most, I2}, options);
  at::Tensor ys = at::empty({most, H}, options);
  float *xsp = xs.data_ptr<float>(), *gup = gate_up.data_ptr<float>(), *yp = ys.data_ptr<float>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = bounds[e], rows = bounds[e + 1] - start;
    if (rows == 0) continue;
    const int64_t* pairs = ord + start;
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy_n(x + (pairs[r] / top_k) * H, H, xsp + r * H);
    });
    const float* we = wgu + e * I2 * H;
    at::parallel_for(0, (I2 + kNR - 1) / kNR, 1, [&](int64_t b0, int64_t b1) {
      weight_rows(xsp, H, rows, H, we, b0 * kNR, std::min(I2, b1 * kNR), gup, I2, we);
    });
    const at::Tensor hidden = silu_mul_halves(gate_up.narrow(0, 0, rows));  // [rows, I]
    const float* hp = hidden.data_ptr<float>();
    const float* wde = wd + e * H * I;
    at::parallel_for(0, (H + kNR - 1) / kNR, 1, [&](int64_t b0, int64_t b1) {
      weight_rows(hp, I, rows, I, wde, b0 * kNR, std::min(H, b1 * kNR), yp, H, wde);
    });
    // A token chooses an expert once: the rows of one expert are distinct tokens.
    at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* row = out + (pairs[r] / top_k) * H;
        const float* y = yp + r * H;
        const float w = wts[pairs[r]];
        for (int64_t h = 0; h < H; ++h) row[h] += y[h] * w;
      }
    });
  }
}

constexpr int64_t kOneByOneRows = 32;  // mean rows per active expert from which experts go one by one

}  // namespace

at::Tensor moe_rows(const at::Tensor& x, const at::Tensor& order, const at::Tensor& offsets, const at::Tensor& weights,
                    const at::Tensor& w_gate_up, const at::Tensor& w_down, int64_t top_k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "moe_rows: x must be float32 [T, H]");
  TORCH_CHECK(w_gate_up.dim() == 3 && w_down.dim() == 3 && w_gate_up.is_contiguous() && w_down.is_contiguous() &&
                  w_gate_up.scalar_type() == at::kFloat && w_down.scalar_type() == at::kFloat,
              "moe_rows: expert weights must be contiguous float32 [E, 2I, H] and [E, H, I]");
  const int64_t T = x.size(0), H = x.size(1), E = w_gate_up.size(0), I2 = w_gate_up.size(1), I = I2 / 2;
  TORCH_CHECK(w_gate_up.size(2) == H && w_down.size(0) == E && w_down.size(1) == H && w_down.size(2) == I,
              "moe_rows: expert weight shapes disagree with x");
  TORCH_CHECK(order.dim() == 1 && order.scalar_type() == at::kLong && offsets.numel() == E + 1 &&
                  offsets.scalar_type() == at::kLong && weights.numel() == T * top_k &&
                  weights.scalar_type() == at::kFloat && order.numel() == T * top_k,
              "moe_rows: order [T*k] int64, offsets [E+1] int64, weights [T*k] float32");
  const int64_t P = order.numel();
  const at::Tensor order_c = order.contiguous(), weights_c = weights.contiguous();
  const int64_t* ord = order_c.data_ptr<int64_t>();
  const float* wts = weights_c.data_ptr<float>();
  const std::vector<int64_t> bounds(offsets.data_ptr<int64_t>(), offsets.data_ptr<int64_t>() + E + 1);
  TORCH_CHECK(bounds[0] == 0 && bounds[E] == P, "moe_rows: offsets must run from 0 to T*k");
  int64_t active = 0;
  for (int64_t e = 0; e < E; ++e) active += bounds[e + 1] > bounds[e];
  if (P >= kOneByOneRows * std::max<int64_t>(active, 1)) {
    at::Tensor out = at::zeros({T, H}, x.options());
    experts_one_by_one(x.data_ptr<float>(), ord, wts, w_gate_up.data_ptr<float>(), w_down.data_ptr<float>(), H, I,
                       top_k, bounds, out.data_ptr<float>(), x.options());
    return out;
  }

  // Each pair's row of x, in expert order: every expert's rows are then one strided run.
  at::Tensor xs = at::empty({P, H}, x.options());
  const float* xp = x.data_ptr<float>();
  float* xsp = xs.data_ptr<float>();
  at::parallel_for(0, P, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) std::copy_n(xp + (ord[p] / top_k) * H, H, xsp + p * H);
  });

  at::Tensor gate_up = at::empty({P, I2}, x.options());
  expert_products(xsp, H, w_gate_up.data_ptr<float>(), I2, gate_up.data_ptr<float>(), bounds,
                  items_of(bounds, E, I2));
  const at::Tensor hidden = silu_mul_halves(gate_up);  // [P, I]
  at::Tensor ys = at::empty({P, H}, x.options());
  expert_products(hidden.data_ptr<float>(), I, w_down.data_ptr<float>(), H, ys.data_ptr<float>(), bounds,
                  items_of(bounds, E, H));

  // Each token's weighted outputs summed in the pairs' order: ascending expert.
  at::Tensor out = at::zeros({T, H}, x.options());
  float* op = out.data_ptr<float>();
  const float* yp = ys.data_ptr<float>();
  at::parallel_for(0, H, 64, [&](int64_t h0, int64_t h1) {
    for (int64_t p = 0; p < P; ++p) {
      float* row = op + (ord[p] / top_k) * H;
      const float* y = yp + p * H;
      const float w = wts[ord[p]];
      for (int64_t h = h0; h < h1; ++h) row[h] += y[h] * w;
    }
  });
  return out;
}
#endif
