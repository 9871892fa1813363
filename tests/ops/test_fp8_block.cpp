// Tests of fp8_block_quantize (FP8 block scaling's casts). The CPU op is checked against a reference
// written out here: each block's amax over its own elements, the scale as the contract states it (fp32
// fp8_max / amax, rounded down to a power of two, here through std::frexp rather than the op's bit mask),
// the codes from core's conversion of the fp32 product; plus properties a wrong blocking breaks (the
// block's largest element lands in the top binade of the format, dequantisation is within the format's
// precision). The CUDA kernel must give the CPU's bits exactly.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "harness.h"
#include "megatron/ops/fp8_block/fp8_block.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using enum DType;
using ops::Fp8ScaleLayout;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Context& cpu() { return testing::cpu_context(); }

double value_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case F64: return t.data<double>()[i];
    case F32: return t.data<float>()[i];
    case BF16: return to_float(t.data<bf16_t>()[i]);
    default: return to_float(t.data<fp16_t>()[i]);
  }
}

float fp8_max_of(DType f) { return f == F8E4M3 ? 448.0f : 57344.0f; }

// The contract's scale for a block whose amax is `amax`.
float reference_scale(float amax, float fp8_max) {
  if (!(amax > 0.0f) || std::isinf(amax)) return 1.0f;  // 0, inf, NaN
  float s = fp8_max / amax;
  if (std::isinf(s)) s = FLT_MAX;
  int e = 0;
  std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, e - 1);
}

uint8_t reference_code(const Tensor& in, int64_t i, float scale, DType f) {
  const float p = in.dtype() == F64 ? float(in.data<double>()[i] * double(scale)) : float(value_at(in, i)) * scale;
  return f == F8E4M3 ? from_float<fp8e4m3_t>(p).bits : from_float<fp8e5m2_t>(p).bits;
}

double decode(uint8_t code, DType f) {
  return f == F8E4M3 ? to_double(fp8e4m3_t{code}) : to_double(fp8e5m2_t{code});
}

// sign * u * 2^e over a wide exponent range, so that blocks have very different amaxes; some rows and
// columns scaled far up or down so that 1 x 128 blocks of rows and of columns differ too.
Tensor random_input(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mant(1.0, 2.0), coin(0.0, 1.0);
  std::uniform_int_distribution<int> expo(-12, 6);
  Tensor t = cpu().empty(Shape{rows, cols}, dtype);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int shift = (r % 7 == 3 ? 9 : 0) - (c % 11 == 5 ? 8 : 0);
      const double v = (coin(rng) < 0.5 ? -1.0 : 1.0) * mant(rng) * std::ldexp(1.0, expo(rng) + shift);
      const int64_t i = r * cols + c;
      switch (dtype) {
        case F64: t.data<double>()[i] = v * (1.0 + 1e-12 * coin(rng)); break;
        case F32: t.data<float>()[i] = float(v); break;
        case BF16: t.data<bf16_t>()[i] = from_float<bf16_t>(float(v)); break;
        default: t.data<fp16_t>()[i] = from_float<fp16_t>(float(v)); break;
      }
    }
  return t;
}

struct Quantized {
  Tensor q, s, q_t, s_t;
};

Quantized quantize(Context& ctx, const Tensor& in, DType f, Fp8ScaleLayout layout, bool want_q = true,
                   bool want_t = true) {
  const int64_t rows = in.dim(0), cols = in.dim(1);
  Quantized o;
  if (want_q) {
    o.q = ctx.empty(Shape{rows, cols}, f);
    o.s = ctx.empty(ops::fp8_scale_shape(layout, rows, cols), F32);
    testing::poison(ctx, o.s);
  }
  if (want_t) {
    o.q_t = ctx.empty(Shape{cols, rows}, f);
    o.s_t = ctx.empty(ops::fp8_scale_shape(layout, cols, rows), F32);
    testing::poison(ctx, o.s_t);
  }
  Tensor dev_in = ctx.empty(in.shape(), in.dtype());
  copy_tensor(ctx, dev_in, in);
  ops::fp8_block_quantize(ctx, o.q, o.s, o.q_t, o.s_t, dev_in, layout);
  return o;
}

Tensor to_host(Context& ctx, const Tensor& t) {
  if (!t.defined()) return t;
  Tensor h = cpu().empty(t.shape(), t.dtype());
  copy_tensor(ctx, h, t);
  return h;
}

// The block of element (r, c) of `in` [rows, cols]: [r0, r1) x [c0, c1).
struct Block {
  int64_t r0, r1, c0, c1;
};

float reference_amax(const Tensor& in, const Block& b) {
  const int64_t cols = in.dim(1);
  float m = 0.0f;
  for (int64_t r = b.r0; r < b.r1; ++r)
    for (int64_t c = b.c0; c < b.c1; ++c) {
      const float a = std::fabs(float(value_at(in, r * cols + c)));
      if (std::isnan(a)) return kNaN;
      m = std::max(m, a);
    }
  return m;
}

// Checks q (or, transposed, q_t) and its scales against the reference, finding each element's
// block for this output; at most a few mismatches are reported.
void expect_output(const Tensor& in, const Tensor& q, const Tensor& s, DType f, bool transposed,
                   Fp8ScaleLayout layout, const std::string& what) {
  const int64_t rows = in.dim(0), cols = in.dim(1);
  const auto* codes = static_cast<const uint8_t*>(q.data_ptr());
  const float* scales = s.data<float>();
  const int64_t ld = s.dim(1);
  std::vector<bool> scale_written(size_t(s.numel()), false);
  std::map<int64_t, float> block_scale;  // by scale index: one amax per block
  int failures = 0;
  for (int64_t r = 0; r < rows && failures < 5; ++r)
    for (int64_t c = 0; c < cols && failures < 5; ++c) {
      Block b{};
      int64_t scale_index = 0;
      if (layout == Fp8ScaleLayout::Blocks128x128) {
        b = {r / 128 * 128, std::min(rows, r / 128 * 128 + 128), c / 128 * 128, std::min(cols, c / 128 * 128 + 128)};
        scale_index = transposed ? (c / 128) * ld + r / 128 : (r / 128) * ld + c / 128;
      } else if (!transposed) {  // each row's 128-column block
        b = {r, r + 1, c / 128 * 128, std::min(cols, c / 128 * 128 + 128)};
        scale_index = (c / 128) * ld + r;
      } else {  // each column's 128-row block
        b = {r / 128 * 128, std::min(rows, r / 128 * 128 + 128), c, c + 1};
        scale_index = (r / 128) * ld + c;
      }
      if (!block_scale.contains(scale_index))
        block_scale[scale_index] = reference_scale(reference_amax(in, b), fp8_max_of(f));
      const float scale = block_scale[scale_index];
      const uint8_t want = reference_code(in, r * cols + c, scale, f);
      const uint8_t got = transposed ? codes[c * rows + r] : codes[r * cols + c];
      if (got != want) {
        ++failures;
        ADD_FAILURE() << what << (transposed ? " q_t" : " q") << " at element (" << r << ", " << c << "): code "
                      << int(got) << ", want " << int(want) << " (scale " << scale << ")";
      }
      if (scales[scale_index] != 1.0f / scale) {
        ++failures;
        ADD_FAILURE() << what << (transposed ? " q_t" : " q") << " scale_inv[" << scale_index << "] = "
                      << scales[scale_index] << ", want " << 1.0f / scale;
      }
      scale_written[size_t(scale_index)] = true;
    }
  for (int64_t i = 0; i < s.numel() && failures == 0; ++i) {
    if (!scale_written[size_t(i)]) {
      EXPECT_EQ(scales[i], 0.0f) << what << ": padding entry " << i << " not 0";
    }
  }
}

const Shape kShapes[] = {Shape{1, 1}, Shape{3, 5}, Shape{37, 129}, Shape{130, 64}, Shape{128, 256}, Shape{257, 300}};

TEST(Fp8BlockQuantize, MatchesTheReferenceForEveryLayoutFormatAndInput) {
  uint64_t seed = 1;
  for (DType dt : {F32, BF16, F16, F64})
    for (DType f : {F8E4M3, F8E5M2})
      for (Fp8ScaleLayout layout : {Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Blocks128x128})
        for (const Shape& shape : kShapes) {
          const Tensor in = random_input(shape[0], shape[1], dt, seed++);
          const std::string what = str_cat(dtype_name(dt), shape, " -> ", dtype_name(f), " ",
                                           ops::fp8_scale_layout_name(layout));
          const Quantized o = quantize(cpu(), in, f, layout);
          expect_output(in, o.q, o.s, f, false, layout, what);
          expect_output(in, o.q_t, o.s_t, f, true, layout, what);
        }
}

// Properties that hold whatever the reference says: the largest element of every row block, scaled, lies in
// (fp8_max / 2, fp8_max] before rounding, [fp8_max / 2, fp8_max] after (the scale is the largest power of two
// that does not saturate it), and each
// dequantised element is within half a unit in the last place of the format (E4M3: 2^-4 relative) or below
// the smallest normal.
TEST(Fp8BlockQuantize, BlockMaximaFillTheTopBinadeAndDequantiseWithinPrecision) {
  const Tensor in = random_input(200, 384, F32, 77);
  const Quantized o = quantize(cpu(), in, F8E4M3, Fp8ScaleLayout::Rows1x128, true, false);
  const auto* codes = static_cast<const uint8_t*>(o.q.data_ptr());
  for (int64_t r = 0; r < 200; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      const float s_inv = o.s.data<float>()[b * o.s.dim(1) + r];
      double top = 0;
      for (int64_t c = b * 128; c < b * 128 + 128; ++c) {
        const double x = in.data<float>()[r * 384 + c], y = decode(codes[r * 384 + c], F8E4M3) * s_inv;
        top = std::max(top, std::fabs(decode(codes[r * 384 + c], F8E4M3)));
        EXPECT_LE(std::fabs(y - x), std::max(std::fabs(x) * 0.0625, std::ldexp(1.0, -6) * s_inv))
            << "element (" << r << ", " << c << ")";
      }
      EXPECT_GE(top, 224.0) << "row " << r << " block " << b << ": the scale is not the largest power of two";
      EXPECT_LE(top, 448.0);
    }
}

TEST(Fp8BlockQuantize, ZeroNanAndTinyBlocks) {
  Tensor in = cpu().empty(Shape{2, 256}, F32);
  for (int64_t i = 0; i < 512; ++i) in.data<float>()[i] = 0.0f;
  in.data<float>()[1 * 256 + 3] = kNaN;         // row 1, block 0: NaN
  in.data<float>()[0 * 256 + 130] = 1e-39f;     // row 0, block 1: the division overflows
  const Quantized o = quantize(cpu(), in, F8E4M3, Fp8ScaleLayout::Rows1x128, true, false);
  const float* s = o.s.data<float>();  // [2 blocks, 4 (2 rows padded)]
  EXPECT_EQ(s[0 * 4 + 0], 1.0f) << "an all-zero block has scale 1";
  EXPECT_EQ(s[0 * 4 + 1], 1.0f) << "a block with NaN has scale 1";
  EXPECT_EQ(s[1 * 4 + 0], std::ldexp(1.0f, -127)) << "overflow: FLT_MAX rounded down to 2^127, inverted exactly";
  EXPECT_EQ(s[1 * 4 + 1], 1.0f);
  EXPECT_EQ(s[0 * 4 + 2], 0.0f) << "padding";
  const auto* codes = static_cast<const uint8_t*>(o.q.data_ptr());
  EXPECT_EQ(codes[1 * 256 + 3] & 0x7f, 0x7f) << "NaN stays NaN";
  EXPECT_NEAR(decode(codes[130], F8E4M3) * double(s[1 * 4 + 0]), double(1e-39f), 1e-39 / 16)
      << "a subnormal input survives";
}

TEST(Fp8BlockQuantize, EachOutputPairAlone) {
  const Tensor in = random_input(130, 200, BF16, 5);
  for (Fp8ScaleLayout layout : {Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Blocks128x128}) {
    const Quantized both = quantize(cpu(), in, F8E5M2, layout);
    const Quantized only_q = quantize(cpu(), in, F8E5M2, layout, true, false);
    const Quantized only_t = quantize(cpu(), in, F8E5M2, layout, false, true);
    EXPECT_EQ(std::memcmp(both.q.data_ptr(), only_q.q.data_ptr(), size_t(both.q.nbytes())), 0);
    EXPECT_EQ(std::memcmp(both.s.data_ptr(), only_q.s.data_ptr(), size_t(both.s.nbytes())), 0);
    EXPECT_EQ(std::memcmp(both.q_t.data_ptr(), only_t.q_t.data_ptr(), size_t(both.q_t.nbytes())), 0);
    EXPECT_EQ(std::memcmp(both.s_t.data_ptr(), only_t.s_t.data_ptr(), size_t(both.s_t.nbytes())), 0);
  }
}

TEST(Fp8BlockQuantize, RejectsBadArguments) {
  Context& c = cpu();
  const Tensor in = random_input(4, 8, F32, 1);
  const Tensor q = c.empty(Shape{4, 8}, F8E4M3);
  const Tensor s = c.empty(ops::fp8_scale_shape(Fp8ScaleLayout::Rows1x128, 4, 8), F32);
  expect_error([&] { ops::fp8_block_quantize(c, q, Tensor(), Tensor(), Tensor(), in, Fp8ScaleLayout::Rows1x128); },
               {"fp8_block_quantize", "q and q_scale_inv must both be given or both be undefined"});
  expect_error([&] { ops::fp8_block_quantize(c, q, c.empty(Shape{1}, F32), Tensor(), Tensor(), in,
                                             Fp8ScaleLayout::Rows1x128); },
               {"q_scale_inv"});
  expect_error([&] { ops::fp8_block_quantize(c, q, s, Tensor(), Tensor(), in, Fp8ScaleLayout::Tensor); },
               {"layout must be Rows1x128 or Blocks128x128"});
  expect_error([&] { ops::fp8_block_quantize(c, Tensor(), Tensor(), Tensor(), Tensor(), in, Fp8ScaleLayout::Rows1x128); },
               {"at least one of q and q_t"});
}

// ---------------------------------------------------------------- CUDA: the CPU's bits exactly

void expect_same_bytes(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(b.data_ptr());
  for (int64_t i = 0; i < int64_t(a.nbytes()); ++i)
    if (pa[i] != pb[i]) {
      ADD_FAILURE() << what << ": first differing byte " << i << " (" << int(pa[i]) << " vs " << int(pb[i]) << ")";
      return;
    }
}

TEST(Fp8BlockQuantizeGpu, BitIdenticalToCpu) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  const Shape shapes[] = {Shape{1, 1},     Shape{3, 5},    Shape{37, 129}, Shape{130, 64},
                          Shape{128, 128}, Shape{257, 300}, Shape{1000, 24}, Shape{512, 4096}};
  uint64_t seed = 100;
  for (DType dt : {F32, BF16, F16})
    for (DType f : {F8E4M3, F8E5M2})
      for (Fp8ScaleLayout layout : {Fp8ScaleLayout::Rows1x128, Fp8ScaleLayout::Blocks128x128})
        for (const Shape& shape : shapes) {
          Tensor in = random_input(shape[0], shape[1], dt, seed++);
          if (in.numel() > 40) {  // a NaN and a zero block's worth of specials
            std::vector<uint8_t> nan_bytes(size_t(dtype_size(dt)), 0xff);
            std::memcpy(static_cast<uint8_t*>(in.data_ptr()) + 37 * dtype_size(dt), nan_bytes.data(), nan_bytes.size());
          }
          const std::string what = str_cat(dtype_name(dt), shape, " -> ", dtype_name(f), " ",
                                           ops::fp8_scale_layout_name(layout));
          const Quantized want = quantize(cpu(), in, f, layout);
          const Quantized got = quantize(gpu, in, f, layout);
          expect_same_bytes(want.q, to_host(gpu, got.q), what + " q");
          expect_same_bytes(want.s, to_host(gpu, got.s), what + " q_scale_inv");
          expect_same_bytes(want.q_t, to_host(gpu, got.q_t), what + " q_t");
          expect_same_bytes(want.s_t, to_host(gpu, got.s_t), what + " q_t_scale_inv");
        }
}

}  // namespace
}  // namespace megatron
