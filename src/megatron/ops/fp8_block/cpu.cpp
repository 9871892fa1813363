// CPU reference of fp8_block_quantize: one 128 x 128 tile of `in` at a time (tiles in parallel, each
// written by one thread), every block's amax a max of int32 keys (ops/fp8/scalar.h), so the result does not
// depend on the thread count.
#include "megatron/ops/fp8_block/cpu.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "megatron/ops/cpu_parallel.h"
#include "megatron/ops/fp8/scalar.h"

namespace megatron::ops::cpu {

namespace {

using fp8_detail::amax_key;

constexpr int64_t kBlock = 128;

template <class TIn>
int32_t key_of(TIn v) {
  if constexpr (std::is_same_v<TIn, double>) return amax_key(float(v));
  else return amax_key(to_float(v));
}

template <class TOut, class TIn>
uint8_t quantise(TIn v, float scale) {
  if constexpr (std::is_same_v<TIn, double>) return from_double<TOut>(v * double(scale)).bits;
  else return from_float<TOut>(to_float(v) * scale).bits;
}

float amax_of_key(int32_t key) { return detail::bits_float(uint32_t(key)); }

struct Outputs {
  uint8_t* q = nullptr;
  float* q_scale_inv = nullptr;
  int64_t q_ld = 0;  // row length of q_scale_inv
  uint8_t* q_t = nullptr;
  float* q_t_scale_inv = nullptr;
  int64_t q_t_ld = 0;
};

// One 1 x 128 block: `len` elements of x at stride x_stride, quantised with their own scale into q at stride
// q_stride; returns the inverse scale.
template <class TOut, class TIn>
float quantise_line(const TIn* x, int64_t x_stride, uint8_t* q, int64_t q_stride, int64_t len, float fp8_max) {
  int32_t key = 0;
  for (int64_t j = 0; j < len; ++j) key = std::max(key, key_of(x[j * x_stride]));
  const float scale = fp8_detail::block_scale_from_amax(amax_of_key(key), fp8_max);
  for (int64_t j = 0; j < len; ++j) q[j * q_stride] = quantise<TOut>(x[j * x_stride], scale);
  return fp8_detail::pow2_reciprocal(scale);
}

// The tile [r0, r1) x [c0, c1) with 1 x 128 blocks: each row's block for q, each column's block for q_t.
template <class TOut, class TIn>
void rows_1x128_tile(const TIn* x, const Outputs& o, int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1, float fp8_max) {
  if (o.q != nullptr)
    for (int64_t r = r0; r < r1; ++r)
      o.q_scale_inv[(c0 / kBlock) * o.q_ld + r] =
          quantise_line<TOut>(x + r * cols + c0, 1, o.q + r * cols + c0, 1, c1 - c0, fp8_max);
  if (o.q_t != nullptr)
    for (int64_t c = c0; c < c1; ++c)
      o.q_t_scale_inv[(r0 / kBlock) * o.q_t_ld + c] =
          quantise_line<TOut>(x + r0 * cols + c, cols, o.q_t + c * rows + r0, 1, r1 - r0, fp8_max);
}

// The tile as one 128 x 128 block: q and its transpose share the codes and the scale.
template <class TOut, class TIn>
void blocks_128x128_tile(const TIn* x, const Outputs& o, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                         int64_t c0, int64_t c1, float fp8_max) {
  int32_t key = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) key = std::max(key, key_of(x[r * cols + c]));
  const float scale = fp8_detail::block_scale_from_amax(amax_of_key(key), fp8_max);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t code = quantise<TOut>(x[r * cols + c], scale);
      if (o.q != nullptr) o.q[r * cols + c] = code;
      if (o.q_t != nullptr) o.q_t[c * rows + r] = code;
    }
  const float scale_inv = fp8_detail::pow2_reciprocal(scale);
  if (o.q != nullptr) o.q_scale_inv[(r0 / kBlock) * o.q_ld + c0 / kBlock] = scale_inv;
  if (o.q_t != nullptr) o.q_t_scale_inv[(c0 / kBlock) * o.q_t_ld + r0 / kBlock] = scale_inv;
}

template <class TOut, class TIn>
void quantize_tiles(const Tensor& in, const Outputs& o, Fp8ScaleLayout layout) {
  const int64_t rows = in.dim(0), cols = in.dim(1);
  const int64_t row_tiles = (rows + kBlock - 1) / kBlock, col_tiles = (cols + kBlock - 1) / kBlock;
  const TIn* x = in.data<TIn>();
  const float fp8_max = dtype_v<TOut> == DType::F8E4M3 ? fp8_detail::kE4M3Max : fp8_detail::kE5M2Max;
  parallel_for(row_tiles * col_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = (t / col_tiles) * kBlock, c0 = (t % col_tiles) * kBlock;
      const int64_t r1 = std::min(rows, r0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      if (layout == Fp8ScaleLayout::Rows1x128) rows_1x128_tile<TOut>(x, o, rows, cols, r0, r1, c0, c1, fp8_max);
      else blocks_128x128_tile<TOut>(x, o, rows, cols, r0, r1, c0, c1, fp8_max);
    }
  });
}

void zero(const Tensor& t) {
  if (t.defined()) std::memset(t.data_ptr(), 0, size_t(t.nbytes()));
}

}  // namespace

void fp8_block_quantize(const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t, const Tensor& q_t_scale_inv,
                        const Tensor& in, Fp8ScaleLayout layout) {
  zero(q_scale_inv);  // the padding entries
  zero(q_t_scale_inv);
  Outputs o;
  if (q.defined()) {
    o.q = static_cast<uint8_t*>(q.data_ptr());
    o.q_scale_inv = q_scale_inv.data<float>();
    o.q_ld = q_scale_inv.shape().cols();
  }
  if (q_t.defined()) {
    o.q_t = static_cast<uint8_t*>(q_t.data_ptr());
    o.q_t_scale_inv = q_t_scale_inv.data<float>();
    o.q_t_ld = q_t_scale_inv.shape().cols();
  }
  const DType fmt = q.defined() ? q.dtype() : q_t.dtype();
  visit_float_dtype(in.dtype(), "fp8_block_quantize", [&]<class TIn>() {
    if constexpr (std::is_same_v<TIn, fp8e4m3_t> || std::is_same_v<TIn, fp8e5m2_t>) {
      MEGATRON_FAIL("fp8_block_quantize: fp8 input ", in.describe(), " is not supported");
    } else if (fmt == DType::F8E4M3) {
      quantize_tiles<fp8e4m3_t, TIn>(in, o, layout);
    } else {
      quantize_tiles<fp8e5m2_t, TIn>(in, o, layout);
    }
  });
}

}  // namespace megatron::ops::cpu
