#include "megatron/ops/embedding/cpu.h"

#include <cstring>
#include <vector>

namespace megatron::ops::cpu {
namespace {

int64_t id_at(const Tensor& ids, int64_t i, int64_t vocab, const char* op) {
  int64_t v = ids.dtype() == DType::I32 ? int64_t(ids.data<int32_t>()[i]) : ids.data<int64_t>()[i];
  MEGATRON_CHECK(v >= 0 && v < vocab, op, ": ids[", i, "] = ", v, " (flat position ", i, " of ids ", ids.describe(),
                 ") is outside the table rows [0, ", vocab, ")");
  return v;
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids, int64_t vocab_start,
                       int64_t global_vocab) {
  const int64_t vocab = weight.dim(0), hidden = weight.dim(1);
  const size_t row_bytes = size_t(hidden) * dtype_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t v = id_at(ids, i, global_vocab, "embedding_forward") - vocab_start;
    if (v >= 0 && v < vocab) std::memcpy(o + size_t(i) * row_bytes, w + size_t(v) * row_bytes, row_bytes);
    else std::memset(o + size_t(i) * row_bytes, 0, row_bytes);  // another shard's row: zero in every float format
  }
}

void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate,
                        int64_t vocab_start, int64_t global_vocab) {
  const int64_t vocab = dweight.dim(0), hidden = dweight.dim(1), tokens = ids.numel();
  for (int64_t i = 0; i < tokens; ++i) id_at(ids, i, global_vocab, "embedding_backward");  // validate before writing
  visit_float_dtype(dweight.dtype(), "embedding_backward", [&]<class TW>() {
    visit_float_dtype(dout.dtype(), "embedding_backward", [&]<class TD>() {
      TW* dw = static_cast<TW*>(dweight.data_ptr());
      const TD* g = static_cast<const TD*>(dout.data_ptr());
      std::vector<double> sum(size_t(vocab * hidden), 0.0);
      std::vector<bool> used(size_t(vocab), false);
      for (int64_t i = 0; i < tokens; ++i) {
        const int64_t v = id_at(ids, i, global_vocab, "embedding_backward") - vocab_start;
        if (v < 0 || v >= vocab) continue;  // another shard's row
        used[size_t(v)] = true;
        for (int64_t h = 0; h < hidden; ++h) sum[size_t(v * hidden + h)] += to_double(g[i * hidden + h]);
      }
      for (int64_t v = 0; v < vocab; ++v)
        for (int64_t h = 0; h < hidden; ++h) {
          size_t k = size_t(v * hidden + h);
          if (accumulate) {
            if (used[size_t(v)]) dw[k] = from_double<TW>(to_double(dw[k]) + sum[k]);
          } else {
            dw[k] = from_double<TW>(sum[k]);
          }
        }
    });
  });
}

}  // namespace megatron::ops::cpu
