// CPU kernels of the elementwise family: elements (or rows) in parallel blocks (ops/cpu_parallel.h), the
// same per-element arithmetic as the sequential reference; sums accumulate in fp64. Reductions that span
// blocks (sum_all) add one partial per block in block order, and amax is a max of keys (order-free), so
// no result depends on the thread count.
#include "megatron/ops/elementwise/cpu.h"

#include <algorithm>
#include <cstring>

#include "megatron/core/philox.h"
#include "megatron/ops/cpu_parallel.h"
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
        parallel_for(in.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) y[i] = convert<TOut>(x[i]);
        });
      }
    });
  });
}

void cast_scaled(const Tensor& out, const Tensor& amax_out, const Tensor& in, float scale) {
  std::vector<uint32_t> keys;  // per block: the largest |in| as an ordered key
  visit_same_float(in, "cast_scaled", [&]<class TIn>() {
    visit_same_float(out, "cast_scaled", [&]<class TOut>() {
      const TIn* x = static_cast<const TIn*>(in.data_ptr());
      TOut* y = static_cast<TOut*>(out.data_ptr());
      keys = parallel_partials<uint32_t>(in.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
        uint32_t key = 0;
        for (int64_t i = begin; i < end; ++i) {
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
        return key;
      });
    });
  });
  *amax_out.data<float>() = detail::bits_float(keys.empty() ? 0u : *std::max_element(keys.begin(), keys.end()));
}

void fill(const Tensor& out, double value) {
  visit_dtype(out.dtype(), [&]<class T>() {
    T v;
    if constexpr (std::is_integral_v<T>) v = saturating_int<T>(value);
    else v = from_double<T>(value);
    T* y = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), kStreamBlock, [&](int64_t begin, int64_t end) { std::fill(y + begin, y + end, v); });
  });
}

void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi, uint64_t index_base) {
  visit_same_float(out, "fill_uniform", [&]<class T>() {
    T* y = static_cast<T*>(out.data_ptr());
    float lo_f = float(lo), range_f = float(hi - lo);
    parallel_for(out.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float u = philox_uniform(seed, offset, index_base + uint64_t(i));
        if constexpr (std::is_same_v<T, double>) y[i] = lo + (hi - lo) * double(u);
        else y[i] = from_float<T>(lo_f + range_f * u);
      }
    });
  });
}

void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std, uint64_t index_base) {
  visit_same_float(out, "fill_normal", [&]<class T>() {
    T* y = static_cast<T*>(out.data_ptr());
    float mean_f = float(mean), std_f = float(std);
    parallel_for(out.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float z = philox_normal(seed, offset, index_base + uint64_t(i));
        if constexpr (std::is_same_v<T, double>) y[i] = mean + std * double(z);
        else y[i] = from_float<T>(mean_f + std_f * z);
      }
    });
  });
}

namespace {
// Transposes [batch, m, n] -> [batch, n, m] for an element of the size of E, in 32 x 32 tiles (both sides
// stay in cache); tiles of rows in parallel.
template <class E>
void transpose_as(void* out, const void* in, int64_t batch, int64_t m, int64_t n) {
  constexpr int64_t kTile = 32;
  const E* x = static_cast<const E*>(in);
  E* y = static_cast<E*>(out);
  const int64_t row_tiles = (m + kTile - 1) / kTile;
  parallel_for(batch * row_tiles, std::max<int64_t>(1, kStreamBlock / (kTile * std::max<int64_t>(n, 1))),
               [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / row_tiles, i0 = (t % row_tiles) * kTile, i1 = std::min(m, i0 + kTile);
      const E* xb = x + b * m * n;
      E* yb = y + b * m * n;
      for (int64_t j0 = 0; j0 < n; j0 += kTile)
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < std::min(n, j0 + kTile); ++j) yb[j * m + i] = xb[i * n + j];
    }
  });
}
}  // namespace

void transpose(const Tensor& out, const Tensor& in, int64_t batch, int64_t m, int64_t n) {
  switch (dtype_size(in.dtype())) {
    case 1: return transpose_as<uint8_t>(out.data_ptr(), in.data_ptr(), batch, m, n);
    case 2: return transpose_as<uint16_t>(out.data_ptr(), in.data_ptr(), batch, m, n);
    case 4: return transpose_as<uint32_t>(out.data_ptr(), in.data_ptr(), batch, m, n);
    case 8: return transpose_as<uint64_t>(out.data_ptr(), in.data_ptr(), batch, m, n);
    default: MEGATRON_FAIL("transpose: unsupported element size ", dtype_size(in.dtype()));
  }
}

namespace {
template <class Fn>
void binary(const Tensor& out, const Tensor& a, const Tensor& b, const char* op, Fn&& fn) {
  visit_same_float(out, op, [&]<class T>() {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    parallel_for(out.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = from_double<T>(fn(to_double(pa[i]), to_double(pb[i])));
    });
  });
}
}  // namespace

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary(out, a, b, "add", [](double x, double y) { return x + y; });
}
void mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  binary(out, a, b, "mul", [](double x, double y) { return x * y; });
}
void scale_rows(const Tensor& out, const Tensor& in, const Tensor& s) {
  const int64_t cols = in.shape().cols();
  visit_same_float(out, "scale_rows", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    auto gate = [&](int64_t r) {
      return in.dtype() == DType::F64 ? s.data<double>()[r] : double(s.data<float>()[r]);
    };
    parallel_for(out.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) y[i] = from_double<T>(to_double(x[i]) * gate(i / cols));
    });
  });
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
    parallel_for(rows, rows_per_block(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) s += to_double(x[r * cols + c]);
        y[r] = float(s);
      }
    });
  });
}

// Column sums in blocks of columns: each block walks every row (in order) over its columns only.
void sum_columns(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  constexpr int64_t kColumns = 256;
  visit_same_float(in, "sum_columns", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    float* y = out.data<float>();
    parallel_for(cols, kColumns, [&](int64_t begin, int64_t end) {
      double acc[kColumns] = {};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = begin; c < end; ++c) acc[c - begin] += to_double(x[r * cols + c]);
      for (int64_t c = begin; c < end; ++c) y[c] = float(acc[c - begin]);
    });
  });
}

void sum_all(const Tensor& out, const Tensor& in) {
  visit_same_float(in, "sum_all", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    const std::vector<double> partial = parallel_partials<double>(in.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      double s = 0;
      for (int64_t i = begin; i < end; ++i) s += to_double(x[i]);
      return s;
    });
    double s = 0;
    for (double p : partial) s += p;
    *out.data<float>() = float(s);
  });
}

void amax(const Tensor& out, const Tensor& in) {
  visit_same_float(in, "amax", [&]<class T>() {
    const T* x = static_cast<const T*>(in.data_ptr());
    const std::vector<uint32_t> keys = parallel_partials<uint32_t>(in.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      uint32_t key = 0;
      for (int64_t i = begin; i < end; ++i) {
        if constexpr (std::is_same_v<T, double>) key = std::max(key, abs_key(float(x[i])));
        else key = std::max(key, abs_key(to_float(x[i])));
      }
      return key;
    });
    *out.data<float>() = detail::bits_float(keys.empty() ? 0u : *std::max_element(keys.begin(), keys.end()));
  });
}

}  // namespace megatron::ops::cpu
