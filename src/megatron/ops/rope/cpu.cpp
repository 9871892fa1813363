// CPU reference RoPE: per pair, angle and rotation in double.
#include "megatron/ops/rope/cpu.h"

#include <cmath>
#include <vector>

namespace megatron::ops::cpu {

void rope_rotate(const Tensor& out, const Tensor& x, int64_t rot_dim, double base, bool interleaved,
                 int64_t position_offset, double sign) {
  visit_float_dtype(x.dtype(), "rope", [&]<class T>() {
    const int64_t B = x.dim(0), S = x.dim(1), H = x.dim(2), D = x.dim(3);
    const int64_t half = rot_dim / 2;
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    std::vector<double> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half)), row(static_cast<size_t>(D));
    for (int64_t s = 0; s < S; ++s) {
      const double pos = double(s + position_offset);
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos * std::pow(base, -2.0 * double(i) / double(rot_dim));
        cos_t[size_t(i)] = std::cos(angle);
        sin_t[size_t(i)] = sign * std::sin(angle);
      }
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base_index = ((b * S + s) * H + h) * D;
          for (int64_t c = 0; c < D; ++c) row[size_t(c)] = to_double(src[base_index + c]);  // out may alias x
          for (int64_t i = 0; i < half; ++i) {
            const int64_t i1 = interleaved ? 2 * i : i;
            const int64_t i2 = interleaved ? 2 * i + 1 : i + half;
            const double x1 = row[size_t(i1)], x2 = row[size_t(i2)];
            const double c = cos_t[size_t(i)], sn = sin_t[size_t(i)];
            dst[base_index + i1] = from_double<T>(x1 * c - x2 * sn);
            dst[base_index + i2] = from_double<T>(x2 * c + x1 * sn);
          }
          for (int64_t c = rot_dim; c < D; ++c) dst[base_index + c] = from_double<T>(row[size_t(c)]);
        }
    }
  });
}

}  // namespace megatron::ops::cpu
