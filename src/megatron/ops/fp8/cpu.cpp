// CPU reference of the fp8 family: plain loops over blocks of rows (ops/cpu_parallel.h), the same
// per-element arithmetic whichever thread runs a block. The amax is a max of int32 keys (exact and
// order-free), so no result depends on the thread count.
#include "megatron/ops/fp8/cpu.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "megatron/ops/cpu_parallel.h"
#include "megatron/ops/fp8/scalar.h"

namespace megatron::ops::cpu {

namespace {

using fp8_detail::amax_key;

// Rows per block of the cast: at least 64, so that a block writes whole 64-byte runs of each out_t row
// (threads then rarely share a cache line of out_t).
constexpr int64_t kMinRowsPerBlock = 64;
// Columns walked at a time inside a block: the out_t lines a block touches stay in cache.
constexpr int64_t kColumnChunk = 64;

// The fp8 code of one element: in * scale in fp32 (fp64 for F64 input, then narrowed through fp32 as
// from_double does), rounded once by core/fp8_convert.h.
template <class TOut, class TIn>
uint8_t quantise(TIn v, float scale) {
  if constexpr (std::is_same_v<TIn, double>) return from_double<TOut>(v * double(scale)).bits;
  else return from_float<TOut>(to_float(v) * scale).bits;
}

template <class TIn>
int32_t key_of(TIn v) {
  if constexpr (std::is_same_v<TIn, double>) return amax_key(float(v));
  else return amax_key(to_float(v));
}

// Rows [r0, r1) of the cast: writes their codes to y (row-major, or null) and yt (transposed, or null);
// returns the largest amax key among them.
template <class TOut, class TIn>
int32_t cast_rows(const TIn* x, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                  float scale) {
  int32_t key = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kColumnChunk) {
    const int64_t c1 = std::min(cols, c0 + kColumnChunk);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const TIn v = x[r * cols + c];
        key = std::max(key, key_of(v));
        const uint8_t code = quantise<TOut>(v, scale);
        if (y != nullptr) y[r * cols + c] = code;
        if (yt != nullptr) yt[c * rows + r] = code;
      }
    }
  }
  return key;
}

template <class TOut, class TIn>
std::vector<int32_t> cast_transpose_blocks(const Tensor& out, const Tensor& out_t, const Tensor& in, float scale) {
  const int64_t rows = in.dim(0), cols = in.dim(1);
  const TIn* x = static_cast<const TIn*>(in.data_ptr());
  auto* y = static_cast<uint8_t*>(out.defined() ? out.data_ptr() : nullptr);
  auto* yt = static_cast<uint8_t*>(out_t.defined() ? out_t.data_ptr() : nullptr);
  const int64_t grain = std::max(kMinRowsPerBlock, rows_per_block(cols));
  return parallel_partials<int32_t>(rows, grain, [&](int64_t r0, int64_t r1) {
    return cast_rows<TOut>(x, y, yt, rows, cols, r0, r1, scale);
  });
}

}  // namespace

void fp8_cast_transpose(const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale) {
  const float s = *scale.data<float>();
  const DType fmt = out.defined() ? out.dtype() : out_t.dtype();
  std::vector<int32_t> keys;
  visit_float_dtype(in.dtype(), "fp8_cast_transpose", [&]<class TIn>() {
    if constexpr (std::is_same_v<TIn, fp8e4m3_t> || std::is_same_v<TIn, fp8e5m2_t>) {
      MEGATRON_FAIL("fp8_cast_transpose: fp8 input ", in.describe(), " is not supported");
    } else if (fmt == DType::F8E4M3) {
      keys = cast_transpose_blocks<fp8e4m3_t, TIn>(out, out_t, in, s);
    } else {
      keys = cast_transpose_blocks<fp8e5m2_t, TIn>(out, out_t, in, s);
    }
  });
  if (!amax.defined()) return;
  int32_t* a = reinterpret_cast<int32_t*>(amax.data<float>());
  for (int32_t k : keys) *a = std::max(*a, k);  // int32 order: a negative amax[0] counts as below 0
}

void fp8_scale_from_amax(const Tensor& scale, const Tensor& scale_inv, const Tensor& amax, float fp8_max,
                         float pow2_margin, bool keep_on_invalid) {
  float* s = scale.data<float>();
  float* s_inv = scale_inv.data<float>();
  const float* a = amax.data<float>();
  for (int64_t i = 0; i < amax.numel(); ++i) {
    s[i] = fp8_detail::scale_from_amax(a[i], s[i], fp8_max, pow2_margin, keep_on_invalid);
    s_inv[i] = fp8_detail::reciprocal(s[i]);
  }
}

void fp8_delayed_scaling_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, float fp8_max,
                                float pow2_margin, bool use_max) {
  const int64_t L = history.dim(0), n = history.dim(1);
  float* h = history.data<float>();
  float* s = scale.data<float>();
  float* s_inv = scale_inv.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float newest = h[i];
    float amax = newest;
    if (use_max)
      for (int64_t r = 1; r < L; ++r) amax = fp8_detail::max_propagating_nan(amax, h[r * n + i]);
    s[i] = fp8_detail::scale_from_amax(amax, s[i], fp8_max, pow2_margin, /*keep_on_invalid=*/true);
    s_inv[i] = fp8_detail::reciprocal(s[i]);
    // Roll up by one row (row r takes row r + 1, the last row takes the old row 0), then zero row 0.
    for (int64_t r = 0; r + 1 < L; ++r) h[r * n + i] = h[(r + 1) * n + i];
    h[(L - 1) * n + i] = newest;
    h[i] = 0.0f;
  }
}

}  // namespace megatron::ops::cpu
