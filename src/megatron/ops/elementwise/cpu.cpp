// CPU reference of the elementwise family: plain loops; sums accumulate in fp64.
#include "megatron/ops/elementwise/cpu.h"

#include <algorithm>
#include <cstring>

#include "megatron/core/philox.h"
#include "megatron/ops/elementwise/scalar.h"

namespace megatron::ops::cpu {

namespace {

using elementwise_detail::abs_key;
using elementwise_detail::saturating_int;

// One element of a cast, by the host conversions of core/float_types.h.
template <class TOut, class TIn>
TOut convert(TIn v) {
  if constexpr (std::is_integral_v<TIn>) {
    return from_float<TOut>(float(v));  // only TOut = float is allowed; int -> f32 rounds to nearest even
  } else if constexpr (std::is_integral_v<TOut>) {
    return saturating_int<TOut>(double(to_float(v)));  // only TIn = float is allowed
  } else {
    return from_double<TOut>(to_double(v));  // narrow: through fp32, exactly as from_float(to_float(v))
  }
}

template <class Fn>
void visit_same_float(const Tensor& t, const char* op, Fn&& fn) {
  visit_float_dtype(t.dtype(), op, std::forward<Fn>(fn));
}

}  // namespace

void cast(const Tensor& out, const Tensor& in) {
  visit_dtype(in.dtype(), [&]<class TIn>() {
    visit_dtype(out.dtype(), [&]<class TOut>() {
      // Only float<->float and int<->f32 reach here (validated); other instantiations are never called.
      if constexpr ((std::is_integral_v<TIn> && !std::is_same_v<TOut, float>) ||
                    (std::is_integral_v<TOut> && !std::is_same_v<TIn, float>)) {
        MEGATRON_FAIL("cast: ", dtype_name(in.dtype()), " -> ", dtype_name(out.dtype()), " is not supported");
      } else {
        const TIn* x = static_cast<const TIn*>(in.data_ptr());
        TOut* y = static_cast<TOut*>(out.data_ptr());
        for (int64_t i = 0; i < in.numel(); ++i) y[i] = convert<TOut>(x[i]);
      }
    });
  });
}

void cast_scaled(const Tensor& out, const Tensor& amax_out, const Tensor& in, float scale) {
  uint32_t key = 0;
  visit_same_float(in, "cast_scaled", [&]<class TIn>() {
    visit_same_float(out, "cast_scaled", [&]<class TOut>() {
      const TIn* x = static_cast<const TIn*>(in.data_ptr());
      TOut* y = static_cast<TOut*>(out.data_ptr());
      for (int64_t i = 0; i < in.numel(); ++i) {
        TIn v = x[i];
        if constexpr (std::is_same_v<TIn, double>) {
          key = std::max(key, abs_key(float(v)));
          y[i] = from_double<TOut>(v * double(scale));
        } else {
          float f = to_float(v);
          key = std::max(key, abs_key(f));
          float p = f * scale;  // one fp32 rounding, as on the GPU
          if constexpr (std::is_same_v<TOut, double>) y[i] = double(p);
          else y[i] = from_float<TOut>(p);
        }
      }
    });
  });
  *amax_out.data<float>() = detail::bits_float(key);
}

void fill(const Tensor& out, double value) {
  visit_dtype(out.dtype(), [&]<class T>() {
    T v;
    if constexpr (std::is_integral_v<T>) v = saturating_int<T>(value);
    else v = from_double<T>(value);
    std::fill_n(static_cast<T*>(out.data_ptr()), out.numel(), v);
  });
}

void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi, uint64_t index_base) {
  visit_same_float(out, "fill_uniform", [&]<class T>() {
    T* y = static_cast<T*>(out.data_ptr());
    float lo_f = float(lo), range_f = float(hi - lo);
    for (int64_t i = 0; i < out.numel(); ++i) {
      float u = philox_uniform(seed, offset, index_base + uint64_t(i));
      if constexpr (std::is_same_v<T, double>) y[i] = lo + (hi - lo) * double(u);
      else y[i] = from_float<T>(lo_f + range_f * u);
    }
  });
}

void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std, uint64_t index_base) {
  visit_same_float(out, "fill_normal", [&]<class T>() {
    T* y = static_cast<T*>(out.data_ptr());
    float mean_f = float(mean), std_f = float(std);
    for (int64_t i = 0; i < out.numel(); ++i) {
      float z = philox_normal(seed, offset, index_base + uint64_t(i));
      if constexpr (std::is_same_v<T, double>) y[i] = mean + std * double(z);
      else y[i] = from_float<T>(mean_f + std_f * z);
    }
  });
}

void transpose(const Tensor& out, const Tensor& in, int64_t batch, int64_t m, int64_t n) {
  size_t es = dtype_size(in.dtype());
  const char* x = static_cast<const char*>(in.data_ptr());
  char* y = static_cast<char*>(out.data_ptr());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(y + ((b * n + j) * m + i) * es, x + ((b * m + i) * n + j) * es, es);
}

namespace {
template <class Fn>
void binary(const Tensor& out, const Tensor& a, const Tensor& b, const char* op, Fn&& fn) {
  visit_same_float(out, op, [&]<class T>() {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    for (int64_t i = 0; i < out.numel(); ++i) y[i] = from_double<T>(fn(to_double(pa[i]), to_double(pb[i])));
  });
}
}  // namespace

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary(out, a, b, "add", [](double x, double y) { return x + y; });
}
void mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary(out, a, b, "mul", [](double x, double y) { return x * y; });
}
void axpby(const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta) {
  if (beta == 0.0) {  // scale: y is not read (it may be x itself)
    binary(out, x, x, "scale", [&](double u, double) { return alpha * u; });
    return;
  }
  binary(out, x, y, "axpby", [&](double u, double v) { return alpha * u + beta * v; });
}

void sum_rows(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  visit_same_float(in, "sum_rows", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    float* y = out.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += to_double(x[r * cols + c]);
      y[r] = float(s);
    }
  });
}

void sum_columns(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  visit_same_float(in, "sum_columns", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    std::vector<double> acc(size_t(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) acc[size_t(c)] += to_double(x[r * cols + c]);
    float* y = out.data<float>();
    for (int64_t c = 0; c < cols; ++c) y[c] = float(acc[size_t(c)]);
  });
}

void sum_all(const Tensor& out, const Tensor& in) {
  visit_same_float(in, "sum_all", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    double s = 0;
    for (int64_t i = 0; i < in.numel(); ++i) s += to_double(x[i]);
    *out.data<float>() = float(s);
  });
}

void amax(const Tensor& out, const Tensor& in) {
  visit_same_float(in, "amax", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    uint32_t key = 0;
    for (int64_t i = 0; i < in.numel(); ++i) {
      if constexpr (std::is_same_v<T, double>) key = std::max(key, abs_key(float(x[i])));
      else key = std::max(key, abs_key(to_float(x[i])));
    }
    *out.data<float>() = detail::bits_float(key);
  });
}

}  // namespace megatron::ops::cpu
