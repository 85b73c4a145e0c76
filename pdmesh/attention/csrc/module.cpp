// The Python module of pdmesh's CPU kernels: one binding per kernel, defined in the
// source file of its concept.
#include <torch/extension.h>

#include "vec_math.h"

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& kv_layer, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, double scale, int64_t window, double softcap);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
void silu_mul_(at::Tensor& gate, const at::Tensor& up);
void write_kv_(at::Tensor& kv_layer, const at::Tensor& k, const at::Tensor& v, const at::Tensor& blocks,
               const at::Tensor& offsets);
at::Tensor silu_mul_halves(const at::Tensor& gate_up);
#ifdef PDMESH_AVX2
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w);
at::Tensor moe_rows(const at::Tensor& x, const at::Tensor& order, const at::Tensor& offsets, const at::Tensor& weights,
                    const at::Tensor& w_gate_up, const at::Tensor& w_down, int64_t top_k);
void paged_prefill_(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_layer, const at::Tensor& tables,
                    const at::Tensor& spans, double scale);
int64_t paged_prefill_tile_rows();
int64_t paged_prefill_lanes();
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto nogil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("paged_decode", &paged_decode, nogil, "decode attention over a paged KV pool (CPU)", py::arg("q"),
        py::arg("kv_layer"), py::arg("block_tables"), py::arg("seq_lens"), py::arg("scale"), py::arg("window") = 0,
        py::arg("softcap") = 0.0);
  m.def("rms_norm", &rms_norm, nogil, "RMSNorm of float32 rows in one pass (CPU)");
  m.def("rope_", &rope_, nogil, "rotary embedding in place, rotate-half form (CPU, float32)");
  m.def("silu_mul_", &silu_mul_, nogil, "gate = silu(gate) * up in place (CPU, float32)");
  m.def("write_kv_", &write_kv_, nogil, "a step's K and V rows into their slots of the paged pool (CPU)");
  m.def("silu_mul_halves", &silu_mul_halves, nogil, "silu(gate) * up from one [rows, 2n] product (CPU, float32)");
#ifdef PDMESH_AVX2
  // Only where it is built for: the model keeps MKL's product everywhere else.
  m.def("linear_rows", &linear_rows, nogil, "x @ w.T for a few rows of x (CPU, float32, AVX2)");
  m.def("moe_rows", &moe_rows, nogil, "a mixture-of-experts feed-forward for a few tokens (CPU, float32, AVX2)");
  m.def("paged_prefill_", &paged_prefill_, nogil, "prefill attention over a paged KV pool into out (CPU, float32)");
  m.def("paged_prefill_tile_rows", &paged_prefill_tile_rows, "query rows per tile: the most query heads per KV head");
  m.def("paged_prefill_lanes", &paged_prefill_lanes, "float32 lanes per vector: head_dim must be a multiple");
#endif
}
