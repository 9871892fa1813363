// Tests of the microscaling family (MXFP8 / MXFP4 block quantisation, CPU only) against a reference written
// here by other means: element formats as lists of their values with a nearest search (ties to the even
// code), scales as ceil(log2 t) by frexp in double. Scalars: E8M0 on every code and on powers of two and
// their neighbours, E2M1 on a dense sweep with every tie, fp8 on random floats. Tensors: codes and scales
// bit for bit for F32 / BF16 / F16 / F64 inputs with a dynamic range spread over blocks, plus blocks of
// zeros, NaN, inf, subnormals, values near FLT_MAX and at max_elem * 2^k; round-trip error within half an
// element ulp times the block scale; grid values round-tripping exactly; values a fixed point of
// quantise-dequantise; dequantised dtypes; E2M1 nibble order; thread-count independence; bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/core/philox.h"
#include "megatron/ops/microscaling/microscaling.h"

namespace megatron {
namespace {

using namespace megatron::testing;
using ops::MxElement;
using enum DType;

constexpr MxElement kElements[] = {MxElement::E4M3, MxElement::E5M2, MxElement::E2M1};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- the reference ----

struct Format {
  std::vector<double> values;  // magnitude of code c (sign bit clear), every finite one, in code order
  uint8_t sign_bit, nan_code;  // nan_code: what a NaN input becomes
  double max;
  int emin, mant_bits;         // smallest normal exponent, mantissa bits (for ulps)
  int inf_magnitude = -1;      // the code of +inf (E5M2 only)
};

Format format_of(MxElement e) {
  Format f;
  if (e == MxElement::E2M1) {
    f.values = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    f.sign_bit = 0x8, f.nan_code = 0x7, f.emin = 0, f.mant_bits = 1;
  } else {
    const int m = e == MxElement::E4M3 ? 3 : 2, bias = e == MxElement::E4M3 ? 7 : 15;
    const int last = e == MxElement::E4M3 ? 0x7e : 0x7b;  // codes above are NaN (and E5M2's inf)
    for (int c = 0; c <= last; ++c) {
      const int exp = c >> m, mant = c & ((1 << m) - 1);
      f.values.push_back(exp == 0 ? std::ldexp(mant, 1 - bias - m) : std::ldexp((1 << m) + mant, exp - bias - m));
    }
    f.sign_bit = 0x80, f.nan_code = 0x7f, f.emin = 1 - bias, f.mant_bits = m;
    if (e == MxElement::E5M2) f.inf_magnitude = 0x7c;
  }
  f.max = f.values.back();
  return f;
}

// Nearest value, ties to the even code, saturating; the input's sign on every result but NaN's.
uint8_t ref_encode(double v, const Format& f) {
  if (std::isnan(v)) return f.nan_code;
  const uint8_t sign = std::signbit(v) ? f.sign_bit : 0;
  const double a = std::fabs(v);
  size_t best = 0;
  for (size_t c = 1; c < f.values.size(); ++c) {
    const double d = std::fabs(a - f.values[c]), d_best = std::fabs(a - f.values[best]);
    if (d < d_best || (d == d_best && (c & 1) == 0)) best = c;
  }
  if (a > f.max) best = f.values.size() - 1;
  return uint8_t(sign | best);
}

double ref_decode(uint8_t code, const Format& f) {
  const uint8_t mag = code & uint8_t(f.sign_bit - 1);
  const double v = mag < f.values.size() ? f.values[mag] : mag == f.inf_magnitude ? kInf : kNaN;
  return (code & f.sign_bit) ? -v : v;
}

// The E8M0 code of 2^ceil(log2 t) clamped to [2^-127, 2^127]; 255 for NaN.
int ref_e8m0(double t) {
  if (std::isnan(t)) return 255;
  if (std::isinf(t)) return 254;
  if (t == 0) return 0;
  int k = 0;
  const double m = std::frexp(t, &k);  // t = m 2^k, m in [0.5, 1)
  return std::clamp((m == 0.5 ? k - 1 : k) + 127, 0, 254);
}

// Transformer Engine's block scale: amax (NaNs skipped) times float(1 / max) as one fp32 product, rounded up
// to a power of two. The double product of two floats is exact; float() then rounds it as fp32 would.
int ref_scale(const double* x, const Format& f) {
  double amax = 0;
  for (int i = 0; i < 32; ++i)
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
  return ref_e8m0(double(float(amax * double(float(1.0 / f.max)))));
}

struct Quantized {
  std::vector<uint8_t> codes, scales;  // one code per element (E2M1 unpacked)
};

Quantized ref_quantize(const std::vector<double>& x, MxElement e) {
  const Format f = format_of(e);
  Quantized q;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const int s = ref_scale(&x[32 * b], f);
    q.scales.push_back(uint8_t(s));
    for (int i = 0; i < 32; ++i) q.codes.push_back(ref_encode(std::ldexp(x[32 * b + i], 127 - s), f));
  }
  return q;
}

// ---- running the op ----

// One code per element from the op's codes tensor (E2M1: element 2i low nibble, 2i + 1 high nibble).
std::vector<uint8_t> unpack(const Tensor& codes, MxElement e, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(codes.data_ptr());
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[size_t(i)] = e == MxElement::E2M1 ? uint8_t((p[i / 2] >> (4 * (i & 1))) & 0xf) : p[i];
  return out;
}

struct OpResult {
  Tensor codes, scales;
  Quantized q;
};

OpResult run_quantize(const Tensor& in, MxElement e) {
  Context& ctx = cpu_context();
  OpResult r{ctx.empty(ops::mx_codes_shape(in.shape(), e), ops::mx_codes_dtype(e)),
             ctx.empty(ops::mx_scales_shape(in.shape()), U8), {}};
  poison(ctx, r.codes);
  poison(ctx, r.scales);
  ops::mx_quantize(ctx, r.codes, r.scales, in, e);
  r.q.codes = unpack(r.codes, e, in.numel());
  const auto* s = r.scales.data<uint8_t>();
  r.q.scales.assign(s, s + r.scales.numel());
  return r;
}

std::vector<double> run_dequantize(const OpResult& r, const Shape& shape, MxElement e, DType dt = F32) {
  Context& ctx = cpu_context();
  Tensor out = ctx.empty(shape, dt);
  poison(ctx, out);
  ops::mx_dequantize(ctx, out, r.codes, r.scales, e);
  return to_doubles(ctx, out);
}

// A tensor of dtype dt holding x (rounded to dt); x is updated to the values the op reads (as fp32).
Tensor make_input(std::vector<double>& x, const Shape& shape, DType dt) {
  Tensor t = cpu_context().empty(shape, dt);
  visit_float_dtype(dt, "make_input", [&]<class T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < x.size(); ++i) {
      p[i] = from_double<T>(x[i]);
      x[i] = double(float(to_double(p[i])));
    }
  });
  return t;
}

// Equal values with equal signs (so -0 != +0), or both NaN.
bool same_bits(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

void expect_matches_reference(const std::vector<double>& x, const OpResult& r, MxElement e, const std::string& what) {
  const Quantized want = ref_quantize(x, e);
  int reported = 0;
  for (size_t b = 0; b < want.scales.size() && reported < 5; ++b)
    if (r.q.scales[b] != want.scales[b] && ++reported)
      ADD_FAILURE() << what << ": block " << b << " scale " << int(r.q.scales[b]) << ", reference "
                    << int(want.scales[b]);
  for (size_t i = 0; i < want.codes.size() && reported < 10; ++i)
    if (r.q.codes[i] != want.codes[i] && ++reported)
      ADD_FAILURE() << what << ": element " << i << " = " << x[i] << " (block scale " << int(want.scales[i / 32])
                    << ") code 0x" << std::hex << int(r.q.codes[i]) << ", reference 0x" << int(want.codes[i]);
}

// ---- inputs ----

// n values (n >= 256, a multiple of 32), block b of magnitude 2^E_b (E_b uniform in [lo, hi]), each element a
// normal times 2^-j (j up to 12) so a block spans many binades; then special blocks 0..7.
std::vector<double> wide_range_values(int64_t n, int lo, int hi, double max_elem, uint64_t seed) {
  std::vector<double> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) {
    const int e = lo + int(philox_u32(seed, 1, i / 32) % uint32_t(hi - lo + 1));
    const int j = int(philox_u32(seed, 2, i) % 13u);
    x[i] = std::ldexp(double(philox_normal(seed, 3, i)), e - j);
  }
  auto block = [&](int b) { return x.begin() + 32 * b; };
  std::fill(block(0), block(1), 0.0);                                           // all zeros: scale 2^-127
  x[32 * 1 + 5] = kNaN;                                                         // NaN skipped by the scale
  x[32 * 2 + 3] = kInf, x[32 * 2 + 30] = -kInf;                                 // inf: the largest scale
  std::fill(block(3), block(4), kNaN);                                          // nothing but NaN
  for (int i = 0; i < 32; ++i) x[size_t(32 * 4 + i)] = max_elem * 0.25 * (2.0 * philox_uniform(seed, 4, i) - 1.0);
  x[32 * 4 + 7] = -max_elem * 0.25;                                             // amax = max * 2^-2 exactly
  for (int i = 0; i < 32; ++i) x[size_t(32 * 5 + i)] = std::ldexp(double(i - 16), -140);  // fp32 subnormals
  for (int i = 0; i < 32; ++i) x[size_t(32 * 6 + i)] = (i % 2 ? -3.0e38 : 1.0e38) * (i + 1) / 32;  // near FLT_MAX
  for (int i = 0; i < 32; ++i) x[size_t(32 * 7 + i)] = i == 0 ? 1000.0 : -std::ldexp(1.0, -i);  // underflow to -0
  return x;
}

// ---- scalars ----

TEST(MicroscalingScalars, E8M0DecodesEveryCode) {
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(double(ops::e8m0_to_float(uint8_t(c))), std::ldexp(1.0, c - 127)) << c;
    EXPECT_EQ(double(ops::e8m0_reciprocal(uint8_t(c))), std::ldexp(1.0, 127 - c)) << c;
  }
  EXPECT_TRUE(std::isnan(ops::e8m0_to_float(255)));
  EXPECT_TRUE(std::isnan(ops::e8m0_reciprocal(255)));
}

TEST(MicroscalingScalars, E8M0RoundsUpToAPowerOfTwo) {
  std::vector<float> v = {0.0f, -0.0f, float(kInf), float(kNaN), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()};
  for (int k = -149; k <= 127; ++k) {  // every power of two and both neighbours
    const float p = std::ldexp(1.0f, k);
    v.insert(v.end(), {p, std::nextafter(p, 0.0f), std::nextafter(p, float(kInf))});
  }
  for (uint64_t i = 0; i < 200000; ++i) v.push_back(detail::bits_float(philox_u32(7, 0, i) & 0x7fffffffu));
  for (float t : v) EXPECT_EQ(int(ops::e8m0_round_up(t)), ref_e8m0(double(t))) << "t = " << t;
}

TEST(MicroscalingScalars, E2M1DecodesTheSixteenCodes) {
  const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_TRUE(same_bits(ops::e2m1_to_float(uint8_t(c)), want[c])) << c;
    EXPECT_TRUE(same_bits(ops::e2m1_to_float(uint8_t(c | 0xf0)), want[c])) << "high bits ignored, code " << c;
  }
}

// A sweep in steps of 1/256 over [-8, 8] meets every midpoint (ties) and the saturation region.
TEST(MicroscalingScalars, E2M1RoundsToNearestEvenAndSaturates) {
  const Format f = format_of(MxElement::E2M1);
  std::vector<float> v = {float(kInf), -float(kInf), float(kNaN), -float(kNaN), 0.0f, -0.0f, 1e-30f, -1e-30f, 1e30f};
  for (int k = -2048; k <= 2048; ++k) v.push_back(float(k) / 256.0f);
  for (uint64_t i = 0; i < 100000; ++i) v.push_back(detail::bits_float(philox_u32(8, 0, i)));
  for (float x : v) EXPECT_EQ(int(ops::e2m1_from_float(x)), int(ref_encode(double(x), f))) << "x = " << x;
  // The ties, spelled out: each goes to the even code (mantissa bit 0).
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float even[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(ops::e2m1_to_float(ops::e2m1_from_float(ties[i])), even[i]) << ties[i];
  EXPECT_EQ(ops::e2m1_from_float(float(kNaN)), 0x7);    // no NaN in E2M1: +6, as the hardware conversion
  EXPECT_EQ(ops::e2m1_from_float(-float(kInf)), 0xf);
  EXPECT_EQ(ops::e2m1_from_float(-0.1f), 0x8);          // a signed zero
}

TEST(MicroscalingScalars, Fp8ElementsMatchTheReference) {
  for (MxElement e : {MxElement::E4M3, MxElement::E5M2}) {
    const Format f = format_of(e);
    for (uint64_t i = 0; i < 100000; ++i) {
      // magnitudes around the format's range: uniform exponent in [-20, 17]
      const float x = std::ldexp(2.0f * philox_uniform(9, 0, i) - 1.0f, int(philox_u32(9, 1, i) % 38u) - 20);
      ASSERT_EQ(int(ops::mx_encode(x, e)), int(ref_encode(double(x), f))) << ops::mx_element_name(e) << " x = " << x;
    }
    for (int c = 0; c < 256; ++c)
      EXPECT_TRUE(same_bits(ops::mx_decode(uint8_t(c), e), ref_decode(uint8_t(c), f)))
          << ops::mx_element_name(e) << " code " << c;
  }
}

// Transformer Engine's rule, not OCP's: the scale is rounded up so nothing saturates. amax = max * 2^k takes
// exactly 2^k (float(1 / max) * max rounds to 1 for all three formats); anything above takes 2^(k + 1).
TEST(MicroscalingScalars, ScaleIsTheSmallestPowerOfTwoThatFitsTheBlock) {
  for (MxElement e : kElements) {
    const float max = ops::mx_element_max(e);
    for (int k = -100; k <= 100; ++k) {
      const float amax = std::ldexp(max, k);
      EXPECT_EQ(int(ops::mx_scale_code(amax, e)), 127 + k) << ops::mx_element_name(e) << " k " << k;
      EXPECT_EQ(int(ops::mx_scale_code(std::nextafter(amax, float(kInf)), e)), 128 + k) << ops::mx_element_name(e);
    }
    EXPECT_EQ(ops::mx_scale_code(0.0f, e), 0);
    EXPECT_EQ(ops::mx_scale_code(float(kInf), e), 254);
  }
  // In exact arithmetic the code is that of 2^ceil(log2(amax / max)), clamped, but for the one amax just above
  // max * 2^-127, where the fp32 product rounds down onto the subnormal 2^-127 (formats.h).
  for (MxElement e : kElements) {
    const double max = ops::mx_element_max(e);
    const float exception = std::nextafter(float(std::ldexp(max, -127)), float(kInf));
    EXPECT_EQ(ops::mx_scale_code(exception, e), 0) << ops::mx_element_name(e);
    for (uint64_t i = 0; i < 200000; ++i) {
      const float amax = detail::bits_float(philox_u32(10, 0, i) % 0x7f800000u);
      const int c = ops::mx_scale_code(amax, e);
      if (amax == exception) continue;
      ASSERT_TRUE((c == 0 || std::ldexp(max, c - 128) < amax) && (c == 254 || amax <= std::ldexp(max, c - 127)))
          << ops::mx_element_name(e) << " amax " << amax << " code " << c;
    }
  }
  // E2M1 amax 7: OCP's floor(log2 7) - 2 = 0 would clip 7 to 6; the round-up takes 2^1 (7 -> 3.5 -> 4).
  EXPECT_EQ(ops::mx_scale_code(7.0f, MxElement::E2M1), 128);
  EXPECT_EQ(ops::mx_scale_code(5.0f, MxElement::E2M1), 127);
}

// ---- tensors ----

struct InputCase {
  DType dtype;
  int lo, hi;  // block magnitudes 2^lo .. 2^hi, within what the dtype holds
};
constexpr InputCase kInputs[] = {{F32, -120, 120}, {BF16, -120, 120}, {F16, -12, 12}, {F64, -120, 120}};

TEST(Microscaling, QuantizeMatchesTheReference) {
  for (MxElement e : kElements) {
    for (const InputCase& c : kInputs) {
      const std::string what = str_cat(ops::mx_element_name(e), " from ", dtype_name(c.dtype));
      const Shape shape{3, 5, 384};  // 45 rows of 12 blocks
      std::vector<double> x = wide_range_values(15 * 384, c.lo, c.hi, ops::mx_element_max(e), seed_from(what));
      const Tensor in = make_input(x, shape, c.dtype);
      const OpResult r = run_quantize(in, e);
      expect_matches_reference(x, r, e, what);
      // The special blocks, as formats.h describes them.
      EXPECT_EQ(r.q.scales[0], 0) << what << ": zeros";
      EXPECT_EQ(r.q.scales[2], 254) << what << ": inf";
      EXPECT_EQ(r.q.scales[3], 0) << what << ": all NaN";
      EXPECT_EQ(int(r.q.scales[4]), 127 - 2) << what << ": amax = max / 4";
      const Format f = format_of(e);
      EXPECT_EQ(size_t(r.q.codes[32 * 4 + 7]), f.sign_bit | (f.values.size() - 1)) << what << ": -max";
    }
  }
}

// With y = decode(code) * scale in exact arithmetic: |y - x| <= half an element ulp (at |x| / scale) times
// the scale, for every finite x of a block without inf, and |x| / scale never exceeds max (no clipping);
// +-inf gives +-max at scale 2^127; NaN gives NaN (E2M1: +6). The op's F32 dequantisation is y rounded to
// fp32 (so inf where it overflows, as for +-max * 2^127).
TEST(Microscaling, RoundTripErrorIsHalfAnElementUlpTimesTheScale) {
  for (MxElement e : kElements) {
    const Format f = format_of(e);
    const Shape shape{16, 512};
    std::vector<double> x = wide_range_values(16 * 512, -120, 120, f.max, seed_from(ops::mx_element_name(e)));
    const Tensor in = make_input(x, shape, F32);
    const OpResult r = run_quantize(in, e);
    const std::vector<double> got = run_dequantize(r, shape, e);
    const char* name = ops::mx_element_name(e);
    for (size_t i = 0; i < x.size(); ++i) {
      const double s = std::ldexp(1.0, int(r.q.scales[i / 32]) - 127);
      const double y = ref_decode(r.q.codes[i], f) * s;
      ASSERT_TRUE(same_bits(got[i], double(float(y)))) << name << " element " << i;
      if (std::isnan(x[i])) {
        EXPECT_TRUE(e == MxElement::E2M1 ? y == 6 * s : std::isnan(y)) << name << " element " << i;
      } else if (std::isinf(x[i])) {
        EXPECT_EQ(y, std::copysign(f.max * std::ldexp(1.0, 127), x[i])) << name << " element " << i;
        EXPECT_EQ(got[i], x[i]) << name << " element " << i;
      } else if (r.q.scales[i / 32] != 254) {
        const double v = std::fabs(x[i]) / s;
        ASSERT_LE(v, f.max) << name << " element " << i << ": the scale let it clip";
        int k = 0;
        std::frexp(v, &k);  // floor(log2 v) = k - 1
        const double ulp = std::ldexp(1.0, std::max(v == 0 ? f.emin : k - 1, f.emin) - f.mant_bits);
        ASSERT_LE(std::fabs(y - x[i]), 0.5 * ulp * s) << name << " element " << i << " = " << x[i];
      }
    }
  }
}

// Blocks of grid values times 2^k (half of them holding +-max * 2^k, whose scale is then exactly 2^k) come
// back exactly; and the dequantised values of any tensor are a fixed point of quantise-dequantise.
TEST(Microscaling, RepresentableValuesRoundTripExactly) {
  for (MxElement e : kElements) {
    const Format f = format_of(e);
    const int64_t blocks = 256;
    std::vector<double> x(size_t(blocks * 32));
    for (size_t i = 0; i < x.size(); ++i) {
      const int k = int(philox_u32(11, 0, i / 32) % 201u) - 100;
      const uint8_t code = uint8_t(philox_u32(11, 1, i) % uint32_t(f.values.size()));
      x[i] = std::ldexp((philox_u32(11, 2, i) & 1 ? -1 : 1) * f.values[code], k);
      if (i % 64 == 5) x[i] = std::ldexp(f.max, k);
    }
    const Shape shape{blocks, 32};
    const Tensor in = make_input(x, shape, F32);
    const OpResult r = run_quantize(in, e);
    const std::vector<double> y = run_dequantize(r, shape, e);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(y[i], x[i])) << ops::mx_element_name(e) << " " << i;
    for (int64_t b = 0; b < blocks; b += 2)
      EXPECT_EQ(int(r.q.scales[size_t(b)]), 127 + int(philox_u32(11, 0, uint64_t(b)) % 201u) - 100);

    const Shape wide{4, 256};
    std::vector<double> w = wide_range_values(4 * 256, -120, 120, f.max, 12);
    std::vector<double> once = run_dequantize(run_quantize(make_input(w, wide, F32), e), wide, e);
    const std::vector<double> twice = run_dequantize(run_quantize(make_input(once, wide, F32), e), wide, e);
    for (size_t b = 0; b < once.size() / 32; ++b) {
      if (!std::all_of(&once[32 * b], &once[32 * b + 32], [](double v) { return std::isfinite(v); })) continue;
      for (size_t i = 32 * b; i < 32 * b + 32; ++i)
        ASSERT_TRUE(same_bits(twice[i], once[i])) << ops::mx_element_name(e) << " element " << i;
    }
  }
}

// Every code at the extreme and ordinary scales, dequantised to each dtype: the fp32 product decode * 2^e
// rounded once (F64: that fp32 product); scale 255 makes its block NaN.
TEST(Microscaling, DequantizeIsOneFp32ProductRoundedOnce) {
  const uint8_t scale_codes[] = {0, 1, 100, 127, 140, 253, 254, 255};
  for (MxElement e : kElements) {
    const Format f = format_of(e);
    const int codes = e == MxElement::E2M1 ? 16 : 256;
    const int64_t per_scale = std::max<int64_t>(codes, 32), n = per_scale * 8;  // each scale over every code
    Context& ctx = cpu_context();
    OpResult r{ctx.empty(ops::mx_codes_shape(Shape{n}, e), ops::mx_codes_dtype(e)), ctx.empty(Shape{n / 32}, U8), {}};
    auto* c = static_cast<uint8_t*>(r.codes.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t code = uint8_t(i % codes);
      if (e == MxElement::E2M1) c[i / 2] = uint8_t(i % 2 ? (c[i / 2] | (code << 4)) : code);
      else c[i] = code;
    }
    for (int64_t b = 0; b < n / 32; ++b) r.scales.data<uint8_t>()[b] = scale_codes[b * 32 / per_scale];
    for (DType dt : {F32, BF16, F16, F64}) {
      const std::vector<double> got = run_dequantize(r, Shape{n}, e, dt);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t sc = scale_codes[i / per_scale];
        const double s = sc == 255 ? kNaN : std::ldexp(1.0, sc - 127);
        const float y = float(ref_decode(uint8_t(i % codes), f) * s);
        const double want =
            visit_float_dtype(dt, "want", [&]<class T>() { return to_double(from_double<T>(double(y))); });
        ASSERT_TRUE(same_bits(got[size_t(i)], want)) << ops::mx_element_name(e) << " " << dtype_name(dt) << " code "
                                                     << i % codes << " scale " << int(sc);
      }
    }
  }
}

TEST(Microscaling, E2M1PacksElementTwoIInTheLowNibble) {
  std::vector<double> x(64, 0.0);
  x[0] = 1, x[1] = -2, x[2] = 0.5, x[3] = 6, x[32] = -0.25, x[33] = 3;  // block 0 amax 6 and block 1 amax 3:
  const Tensor in = make_input(x, Shape{2, 32}, F32);                     // scales 2^0 and 2^-1
  const OpResult r = run_quantize(in, MxElement::E2M1);
  EXPECT_EQ(r.codes.shape(), (Shape{2, 16}));
  const auto* c = static_cast<const uint8_t*>(r.codes.data_ptr());
  EXPECT_EQ(int(c[0]), 0xC2);   // 1 -> 0x2 low, -2 -> 0xC high
  EXPECT_EQ(int(c[1]), 0x71);   // 0.5 -> 0x1 low, 6 -> 0x7 high
  EXPECT_EQ(int(c[16]), 0x79);  // -0.25 / 2^-1 = -0.5 -> 0x9 low, 3 / 2^-1 = 6 -> 0x7 high
  EXPECT_EQ(int(r.q.scales[0]), 127);
  EXPECT_EQ(int(r.q.scales[1]), 126);
}

// Blocks are cut by size, never by thread count: 1, 2 and 4 threads give the same bytes.
TEST(Microscaling, ResultsDoNotDependOnTheThreadCount) {
  const Shape shape{64, 4096};  // 8192 blocks: many parallel chunks
  std::vector<double> x = wide_range_values(64 * 4096, -60, 60, 448, 13);
  const Tensor in = make_input(x, shape, BF16);
  for (MxElement e : kElements) {
    std::vector<uint8_t> first_codes, first_scales;
    for (int threads : kThreadCounts) {
      ScopedCpuThreads scope(threads);
      const OpResult r = run_quantize(in, e);
      if (first_codes.empty()) {
        first_codes = r.q.codes, first_scales = r.q.scales;
        continue;
      }
      EXPECT_EQ(r.q.codes, first_codes) << ops::mx_element_name(e) << " at " << threads << " threads";
      EXPECT_EQ(r.q.scales, first_scales) << ops::mx_element_name(e) << " at " << threads << " threads";
    }
  }
}

TEST(Microscaling, CodesAndScalesMayTakeAnyLeadingDimensions) {
  Context& ctx = cpu_context();
  std::vector<double> x = wide_range_values(6 * 256, -10, 10, 448, 14);
  const Tensor in = make_input(x, Shape{2, 3, 256}, F32);
  const OpResult r = run_quantize(in, MxElement::E4M3);
  EXPECT_EQ(r.codes.shape(), (Shape{2, 3, 256}));
  EXPECT_EQ(r.scales.shape(), (Shape{2, 3, 8}));
  Tensor codes = ctx.empty(Shape{6, 256}, F8E4M3), scales = ctx.empty(Shape{6, 8}, U8);
  ops::mx_quantize(ctx, codes, scales, in, MxElement::E4M3);
  EXPECT_EQ(std::memcmp(codes.data_ptr(), r.codes.data_ptr(), codes.nbytes()), 0);
  EXPECT_EQ(std::memcmp(scales.data_ptr(), r.scales.data_ptr(), scales.nbytes()), 0);
  Tensor empty_in = ctx.empty(Shape{0, 64}, F32);
  ops::mx_quantize(ctx, ctx.empty(Shape{0, 32}, U8), ctx.empty(Shape{0, 2}, U8), empty_in, MxElement::E2M1);
}

TEST(Microscaling, BadArgumentsAreRefusedByName) {
  Context& ctx = cpu_context();
  auto quantize = [&](Shape codes, DType codes_dtype, Shape scales, const Tensor& in, MxElement e) {
    return [=, &ctx] { ops::mx_quantize(ctx, ctx.empty(codes, codes_dtype), ctx.empty(scales, U8), in, e); };
  };
  const Tensor in48 = ctx.empty(Shape{4, 48}, F32), in = ctx.empty(Shape{4, 64}, F32);
  expect_error(quantize({4, 48}, F8E4M3, {4, 1}, in48, MxElement::E4M3),
               {"mx_quantize", "in", "f32[4, 48]", "multiple of the MX block size 32"});
  expect_error(quantize({4, 64}, U8, {4, 2}, in, MxElement::E4M3), {"mx_quantize", "codes", "u8[4, 64]", "f8e4m3"});
  expect_error(quantize({4, 64}, F8E5M2, {4, 4}, in, MxElement::E5M2),
               {"mx_quantize", "scales", "u8[4, 4]", "[4, 2]", "f32[4, 64]"});
  expect_error(quantize({4, 64}, U8, {4, 2}, in, MxElement::E2M1),
               {"mx_quantize", "codes", "u8[4, 64]", "[4, 32]", "e2m1"});
  expect_error(quantize({4, 64}, F8E4M3, {4, 2}, ctx.empty(Shape{4, 64}, I32), MxElement::E4M3),
               {"mx_quantize", "in", "i32[4, 64]"});
  expect_error([&] { ops::mx_dequantize(ctx, in, ctx.empty(Shape{4, 32}, U8), ctx.empty(Shape{2, 2}, U8),
                                        MxElement::E2M1); },
               {"mx_dequantize", "scales", "u8[2, 2]", "[4, 2]"});
  expect_error([&] { ops::mx_dequantize(ctx, ctx.empty(Shape{}, F32), ctx.empty(Shape{1}, F8E4M3),
                                        ctx.empty(Shape{1}, U8), MxElement::E4M3); },
               {"mx_dequantize", "out", "multiple of the MX block size 32"});
  // A tensor that claims to live on a GPU (no CUDA call is made: the check reads the tag).
  float fake[64] = {};
  const Tensor on_gpu = Tensor::from_blob(fake, Shape{1, 64}, F32, Device::cuda(0));
  expect_error(quantize({1, 64}, F8E4M3, {1, 2}, on_gpu, MxElement::E4M3),
               {"mx_quantize", "in", "cuda:0", "runs on cpu"});
}

}  // namespace
}  // namespace megatron
