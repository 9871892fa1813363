// CPU reference: the same fp32 operations as the CUDA kernel (so outputs match bit for bit), fp64 for F64.
#include "megatron/ops/dropout/cpu.h"

#include "megatron/core/philox.h"

namespace megatron::ops::cpu {

void dropout(const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, float p, uint64_t seed,
             uint64_t offset, uint64_t index_base) {
  const int64_t n = x.numel(), h = x.rank() >= 1 ? x.shape().cols() : 1;
  const float scale = p < 1.f ? float(1.0 / (1.0 - double(p))) : 0.f;
  const double scale64 = p < 1.f ? 1.0 / (1.0 - double(p)) : 0.0;
  visit_float_dtype(x.dtype(), "dropout (cpu)", [&]<class T>() {
    const T* px = x.data<T>();
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    const T* pr = residual.defined() ? residual.data<T>() : nullptr;
    T* py = y.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = philox_uniform(seed, offset, index_base + uint64_t(i)) >= p;
      if constexpr (std::is_same_v<T, double>) {
        double v = px[i] + (pb ? pb[i % h] : 0.0);
        v = keep ? v * scale64 : 0.0;
        py[i] = pr ? pr[i] + v : v;
      } else {
        float v = to_float(px[i]);
        if (pb) v = v + to_float(pb[i % h]);
        v = keep ? v * scale : 0.f;
        if (pr) v = to_float(pr[i]) + v;
        py[i] = from_float<T>(v);
      }
    }
  });
}

}  // namespace megatron::ops::cpu
