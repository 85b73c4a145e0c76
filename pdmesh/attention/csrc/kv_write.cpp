// A step's keys and values stored into the paged KV pool (CPU).
//
// Token t's K and V rows go to block ``blocks[t]``, offset ``offsets[t]``. Two advanced-
// index assignments in torch did the same at ~80 us a layer for a 64-token decode step
// (index tensors built and checked, a TensorIterator per call): 0.66 ms of a 28 ms step on
// the default model (docs/performance/log.md, section 23). Here it is one copy per row, and
// the indices are checked as they are read. The rows may come strided (a slice of the
// fused qkv product, transposed for few rows): each is copied element by element then,
// with a memcpy where the head dimension is contiguous.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cstring>

namespace {

template <typename T>
void copy_row(T* dst, const T* src, int64_t n, int64_t stride) {
  if (stride == 1) {
    std::memcpy(dst, src, n * sizeof(T));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
  }
}

}  // namespace

void write_kv_(at::Tensor& kv_layer, const at::Tensor& k, const at::Tensor& v, const at::Tensor& blocks,
               const at::Tensor& offsets) {
  TORCH_CHECK(kv_layer.dim() == 5 && kv_layer.size(1) == 2 && kv_layer.stride(4) == 1,
              "write_kv_: kv_layer must be [blocks, 2, block_size, kv_heads, head_dim] with contiguous head_dim");
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.size(1) == kv_layer.size(3) && k.size(2) == kv_layer.size(4),
              "write_kv_: k and v must be [tokens, kv_heads, head_dim] matching the pool");
  TORCH_CHECK(k.scalar_type() == kv_layer.scalar_type() && v.scalar_type() == kv_layer.scalar_type(),
              "write_kv_: k, v and the pool must share a dtype");
  TORCH_CHECK(blocks.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong && blocks.is_contiguous() &&
                  offsets.is_contiguous() && blocks.numel() == k.size(0) && offsets.numel() == k.size(0),
              "write_kv_: blocks and offsets must be contiguous int64 [tokens]");
  const int64_t tokens = k.size(0), heads = k.size(1), dim = k.size(2);
  const int64_t num_blocks = kv_layer.size(0), block_size = kv_layer.size(2);
  const int64_t* bp = blocks.data_ptr<int64_t>();
  const int64_t* op = offsets.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(bp[t] >= 0 && bp[t] < num_blocks && op[t] >= 0 && op[t] < block_size,
                "write_kv_: slot (", bp[t], ", ", op[t], ") outside the pool");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, kv_layer.scalar_type(), "write_kv_", [&] {
    scalar_t* pool = kv_layer.data_ptr<scalar_t>();
    const int64_t s_block = kv_layer.stride(0), s_kv = kv_layer.stride(1), s_tok = kv_layer.stride(2),
                  s_head = kv_layer.stride(3);
    // K then V: each one's base pointer and strides, read once rather than per row.
    const scalar_t* src[2] = {k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>()};
    const int64_t s_t[2] = {k.stride(0), v.stride(0)}, s_h[2] = {k.stride(1), v.stride(1)},
                  s_d[2] = {k.stride(2), v.stride(2)};
    at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int kv = 0; kv < 2; ++kv) {
          const scalar_t* row = src[kv] + t * s_t[kv];
          scalar_t* dst = pool + bp[t] * s_block + kv * s_kv + op[t] * s_tok;
          for (int64_t h = 0; h < heads; ++h) copy_row(dst + h * s_head, row + h * s_h[kv], dim, s_d[kv]);
        }
      }
    });
  });
}
