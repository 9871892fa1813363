// The narrow float conversions (core/float_types.h, core/fp8_convert.h) against independent references:
// the shift rule for bf16 widening, the x86 F16C instructions for fp16, a decoding formula written with
// ldexp for fp8 widening, and for narrowing a nearest-value search in double over the target's values.
// The GPU twin (test_float_types_cuda.cu) compares the same functions with the CUDA intrinsics.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "megatron/core/dtype.h"

namespace megatron {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
constexpr uint32_t kCanonicalNaN = 0x7fffffffu;

__attribute__((target("f16c"))) float f16c_widen(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t f16c_narrow(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
bool have_f16c() { return __builtin_cpu_supports("f16c"); }

// Random floats that exercise every range: raw bit patterns (NaN, inf, subnormals included) and
// values spread over the exponents around the narrow formats' ranges.
std::vector<float> random_floats(size_t n, uint64_t seed, int min_exp, int max_exp) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = rng();
    if (i % 4 == 0) {
      v[i] = from_bits(uint32_t(r));
    } else {
      int e = min_exp + int((r >> 32) % uint64_t(max_exp - min_exp + 1));
      uint32_t mant = uint32_t(r) & 0x7fffffu;
      uint32_t sign = uint32_t(r >> 40) & 1u;
      // Every fourth of these sits on a short mantissa, so exact midpoints and ties occur often.
      if (i % 4 == 3) mant &= ~((1u << (uint32_t(r >> 48) % 23u)) - 1u);
      v[i] = from_bits((sign << 31) | (uint32_t(e + 127) << 23) | mant);
    }
  }
  return v;
}

// ---------------------------------------------------------------- widening

TEST(FloatTypes, Bf16WideningIsTheShiftRuleOnEveryPattern) {
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint32_t got = bits(to_float(bf16_t{uint16_t(b)}));
    if (got != b << 16 && bad++ < 10) ADD_FAILURE() << std::hex << "bf16 0x" << b << " -> 0x" << got;
  }
  EXPECT_EQ(bad, 0);
}

TEST(FloatTypes, Fp16WideningMatchesF16cOnEveryPattern) {
  if (!have_f16c()) GTEST_SKIP() << "CPU without F16C";
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float got = to_float(fp16_t{uint16_t(h)});
    float ref = f16c_widen(uint16_t(h));
    bool ok = std::isnan(ref) ? bits(got) == kCanonicalNaN  // contract: every NaN -> canonical NaN
                              : bits(got) == bits(ref);
    if (!ok && bad++ < 10)
      ADD_FAILURE() << std::hex << "fp16 0x" << h << " -> 0x" << bits(got) << ", F16C 0x" << bits(ref);
  }
  EXPECT_EQ(bad, 0);
}

// Independent decoding: (-1)^s * 2^(e - bias) * (1 + m / 2^M), subnormals 2^(1 - bias) * m / 2^M.
double decode_fp8(uint8_t code, int mant_bits, int bias, bool ieee_specials) {
  int s = code >> 7;
  int e = (code >> mant_bits) & ((1 << (7 - mant_bits)) - 1);
  int m = code & ((1 << mant_bits) - 1);
  int emax = (1 << (7 - mant_bits)) - 1;
  double sign = s ? -1.0 : 1.0;
  if (ieee_specials && e == emax) return m == 0 ? sign * INFINITY : NAN;
  if (!ieee_specials && e == emax && m == (1 << mant_bits) - 1) return NAN;
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - mant_bits);
  return sign * std::ldexp(double((1 << mant_bits) + m), e - bias - mant_bits);
}
double decode(fp8e4m3_t v) { return decode_fp8(v.bits, 3, 7, false); }
double decode(fp8e5m2_t v) { return decode_fp8(v.bits, 2, 15, true); }

template <class T>
void expect_fp8_widening_exact() {
  int bad = 0, nans = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    T v{uint8_t(c)};
    float got = to_float(v);
    double ref = decode(v);
    bool ok;
    if (std::isnan(ref)) {
      ++nans;
      ok = bits(got) == kCanonicalNaN;
    } else {
      ok = double(got) == ref && std::signbit(got) == std::signbit(ref);
    }
    if (!ok && bad++ < 10) ADD_FAILURE() << std::hex << "code 0x" << c << " -> " << got << " expected " << ref;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(nans, (std::is_same_v<T, fp8e4m3_t> ? 2 : 6));
}
TEST(FloatTypes, Fp8E4m3WideningMatchesDecodingFormula) { expect_fp8_widening_exact<fp8e4m3_t>(); }
TEST(FloatTypes, Fp8E5m2WideningMatchesDecodingFormula) { expect_fp8_widening_exact<fp8e5m2_t>(); }

TEST(FloatTypes, Fp8ExtremesDecodeToTheirNominalValues) {
  EXPECT_EQ(to_float(fp8e4m3_t{0x7e}), 448.0f);
  EXPECT_EQ(to_float(fp8e4m3_t{0xfe}), -448.0f);
  EXPECT_EQ(to_float(fp8e4m3_t{0x01}), std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(fp8e4m3_t{0x08}), std::ldexp(1.0f, -6));
  EXPECT_EQ(to_float(fp8e5m2_t{0x7b}), 57344.0f);
  EXPECT_EQ(to_float(fp8e5m2_t{0x01}), std::ldexp(1.0f, -16));
  EXPECT_EQ(to_float(fp8e5m2_t{0x04}), std::ldexp(1.0f, -14));
  EXPECT_EQ(to_float(fp8e5m2_t{0xfc}), -INFINITY);
  EXPECT_EQ(bits(to_float(fp8e4m3_t{0x80})), 0x80000000u);
  EXPECT_EQ(bits(to_float(fp8e5m2_t{0x80})), 0x80000000u);
}

// ---------------------------------------------------------------- fp16 narrowing vs F16C

void expect_fp16_narrowing_matches_f16c(const std::vector<float>& xs, const char* what) {
  int bad = 0;
  for (float x : xs) {
    uint16_t got = fp16_from_float(x).bits;
    uint16_t ref = f16c_narrow(x);
    bool ref_nan = (ref & 0x7c00u) == 0x7c00u && (ref & 0x3ffu) != 0;
    bool ok = ref_nan ? got == 0x7fffu : got == ref;  // contract: NaN -> canonical 0x7FFF
    if (!ok && bad++ < 10)
      ADD_FAILURE() << what << std::hex << ": float 0x" << bits(x) << " (" << x << ") -> 0x" << got << ", F16C 0x"
                    << ref;
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(FloatTypes, Fp16NarrowingMatchesF16cOnEdgeCases) {
  if (!have_f16c()) GTEST_SKIP() << "CPU without F16C";
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, from_bits(0x7f800001u), from_bits(0xffc00001u),
                           65504.0f, 65519.99f, 65520.0f, 65536.0f, -65520.0f, FLT_MAX, -FLT_MAX, FLT_MIN,
                           FLT_TRUE_MIN, -FLT_TRUE_MIN, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24),
                           std::ldexp(1.0f, -25), std::nextafter(std::ldexp(1.0f, -25), 1.0f),
                           std::ldexp(3.0f, -26), std::ldexp(1.0f, -26), 1.0f, -1.0f};
  // Every fp16 value, the midpoints between neighbours and one fp32 ulp either side of them.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    float lo = to_float(fp16_t{uint16_t(h)});
    float hi = h + 1 < 0x7c00u ? to_float(fp16_t{uint16_t(h + 1)}) : 65536.0f;
    float mid = float((double(lo) + double(hi)) / 2);
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  expect_fp16_narrowing_matches_f16c(xs, "edge cases");
}

TEST(FloatTypes, Fp16NarrowingMatchesF16cOnRandomFloats) {
  if (!have_f16c()) GTEST_SKIP() << "CPU without F16C";
  expect_fp16_narrowing_matches_f16c(random_floats(size_t(1) << 22, 1601, -30, 18), "random");
}

// ---------------------------------------------------------------- bf16 and fp8 narrowing

// All finite non-negative values of a format, ascending, with their codes.
struct Grid {
  std::vector<double> value;
  std::vector<uint32_t> code;
};
template <class T>
Grid finite_grid() {
  Grid g;
  uint32_t limit = std::is_same_v<T, bf16_t> ? 0x8000u : 0x80u;
  for (uint32_t c = 0; c < limit; ++c) {
    double v;
    if constexpr (std::is_same_v<T, bf16_t>) v = double(from_bits(c << 16));
    else v = decode(T{uint8_t(c)});
    if (std::isfinite(v)) {
      g.value.push_back(v);
      g.code.push_back(c);
    }
  }
  return g;
}
template <class T>
uint32_t code_of(T v) {
  return v.bits;
}
template <class T>
T narrow(float x) {
  return from_float<T>(x);
}

// Reference narrowing: the nearest value by search in double, ties to the even code; beyond the largest
// finite value: bf16 rounds to inf past the midpoint to 2^128, fp8 saturates; NaN -> canonical NaN.
template <class T>
uint32_t reference_narrow(const Grid& g, float x) {
  constexpr bool kBf16 = std::is_same_v<T, bf16_t>;
  constexpr uint32_t kSignBit = kBf16 ? 0x8000u : 0x80u;
  if (std::isnan(x)) return kBf16 ? 0x7fffu : 0x7fu;
  uint32_t sign = std::signbit(x) ? kSignBit : 0u;
  double a = std::fabs(double(x));
  if (kBf16) {
    double overflow_mid = (g.value.back() + std::ldexp(1.0, 128)) / 2;
    if (a >= overflow_mid) return sign | 0x7f80u;
  } else if (a >= g.value.back()) {
    return sign | g.code.back();
  }
  // First grid value >= a (exists, a < max or handled above); compare with its lower neighbour.
  size_t hi = size_t(std::lower_bound(g.value.begin(), g.value.end(), a) - g.value.begin());
  if (hi == g.value.size()) return sign | g.code.back();
  if (g.value[hi] == a || hi == 0) return sign | g.code[hi];
  double d_lo = a - g.value[hi - 1], d_hi = g.value[hi] - a;
  size_t pick = d_lo < d_hi ? hi - 1 : d_hi < d_lo ? hi : ((g.code[hi] & 1u) ? hi - 1 : hi);
  return sign | g.code[pick];
}

// Same as reference_narrow but by brute force over every code (fp8 only: 256 values).
template <class T>
uint32_t exhaustive_nearest_fp8(float x) {
  if (std::isnan(x)) return 0x7fu;
  double best_d = INFINITY;
  uint32_t best = 0;
  // Beyond twice the largest finite value the nearest is that value, and distances computed in double
  // would no longer tell the neighbours apart: clamp there (this also maps inf).
  double max_finite = decode(T{uint8_t(std::is_same_v<T, fp8e4m3_t> ? 0x7e : 0x7b)});
  double xd = std::clamp(double(x), -2 * max_finite, 2 * max_finite);
  for (uint32_t c = 0; c < 256; ++c) {
    double v = decode(T{uint8_t(c)});
    if (!std::isfinite(v)) continue;
    // Only codes with x's sign compete, so zeros and ties keep the sign of x.
    if (std::signbit(v) != std::signbit(xd)) continue;
    double d = std::fabs(xd - v);
    if (d < best_d || (d == best_d && (c & 1u) == 0)) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

template <class T>
void expect_narrowing_matches_reference(const std::vector<float>& xs, const char* what) {
  Grid g = finite_grid<T>();
  int bad = 0;
  for (float x : xs) {
    uint32_t got = code_of(narrow<T>(x));
    uint32_t ref = reference_narrow<T>(g, x);
    if (got != ref && bad++ < 10)
      ADD_FAILURE() << what << std::hex << ": float 0x" << bits(x) << " (" << x << ") -> 0x" << got << " expected 0x"
                    << ref;
  }
  EXPECT_EQ(bad, 0) << what;
}

// Round trip, exact midpoints (ties to even), one fp32 ulp either side of each midpoint.
template <class T>
void expect_grid_round_trip_and_ties() {
  Grid g = finite_grid<T>();
  int bad = 0;
  auto check = [&](float x, uint32_t want, const char* what) {
    uint32_t got = code_of(narrow<T>(x));
    if (got != want && bad++ < 10)
      ADD_FAILURE() << what << std::hex << ": float 0x" << bits(x) << " (" << x << ") -> 0x" << got << " expected 0x"
                    << want;
  };
  uint32_t sign_bit = std::is_same_v<T, bf16_t> ? 0x8000u : 0x80u;
  for (size_t i = 0; i < g.value.size(); ++i) {
    float v = float(g.value[i]);
    ASSERT_EQ(double(v), g.value[i]);
    check(v, g.code[i], "round trip");
    check(-v, g.code[i] | sign_bit, "round trip (negative)");
    if (i + 1 < g.value.size()) {
      float mid = float((g.value[i] + g.value[i + 1]) / 2);
      ASSERT_EQ(double(mid), (g.value[i] + g.value[i + 1]) / 2) << "midpoint not exact in fp32";
      uint32_t even = (g.code[i] & 1u) ? g.code[i + 1] : g.code[i];
      check(mid, even, "tie to even");
      check(-mid, even | sign_bit, "tie to even (negative)");
      check(std::nextafter(mid, 0.0f), g.code[i], "just below midpoint");
      check(std::nextafter(mid, INFINITY), g.code[i + 1], "just above midpoint");
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(FloatTypes, Bf16RoundTripAndTiesToEven) { expect_grid_round_trip_and_ties<bf16_t>(); }
TEST(FloatTypes, Fp8E4m3RoundTripAndTiesToEven) { expect_grid_round_trip_and_ties<fp8e4m3_t>(); }
TEST(FloatTypes, Fp8E5m2RoundTripAndTiesToEven) { expect_grid_round_trip_and_ties<fp8e5m2_t>(); }

TEST(FloatTypes, Bf16SpecialValues) {
  EXPECT_EQ(bf16_from_float(INFINITY).bits, 0x7f80u);
  EXPECT_EQ(bf16_from_float(-INFINITY).bits, 0xff80u);
  EXPECT_EQ(bf16_from_float(FLT_MAX).bits, 0x7f80u);  // past the midpoint to 2^128: rounds to inf
  EXPECT_EQ(bf16_from_float(-FLT_MAX).bits, 0xff80u);
  EXPECT_EQ(bf16_from_float(from_bits(0x7f7f7fffu)).bits, 0x7f7fu);  // just below that midpoint
  EXPECT_EQ(bf16_from_float(0.0f).bits, 0x0000u);
  EXPECT_EQ(bf16_from_float(-0.0f).bits, 0x8000u);
  EXPECT_EQ(bf16_from_float(FLT_TRUE_MIN).bits, 0x0000u);    // 2^-149 is below half the bf16 subnormal step
  EXPECT_EQ(bf16_from_float(-FLT_TRUE_MIN).bits, 0x8000u);
  EXPECT_EQ(bf16_from_float(from_bits(0x00008001u)).bits, 0x0001u);  // just above half the smallest subnormal
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7fbfffffu})
    EXPECT_EQ(bf16_from_float(from_bits(nan)).bits, 0x7fffu) << std::hex << nan;
}

template <class T>
void expect_fp8_specials(float max_finite, uint32_t max_code, float min_sub) {
  auto c = [](float x) { return code_of(narrow<T>(x)); };
  float ulp_at_max = max_finite - float(to_float(T{uint8_t(max_code - 1)}));
  for (float big : {max_finite, std::nextafter(max_finite, INFINITY), max_finite + ulp_at_max / 2,
                    max_finite + ulp_at_max, 2 * max_finite, 1e30f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(c(big), max_code) << big;
    EXPECT_EQ(c(-big), max_code | 0x80u) << -big;
  }
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu})
    EXPECT_EQ(c(from_bits(nan)), 0x7fu) << std::hex << nan;
  EXPECT_EQ(c(0.0f), 0x00u);
  EXPECT_EQ(c(-0.0f), 0x80u);
  EXPECT_EQ(c(min_sub / 2), 0x00u);  // tie between 0 and the smallest subnormal: even is 0
  EXPECT_EQ(c(-min_sub / 2), 0x80u);
  EXPECT_EQ(c(std::nextafter(min_sub / 2, 1.0f)), 0x01u);
  EXPECT_EQ(c(-std::nextafter(min_sub / 2, 1.0f)), 0x81u);
  EXPECT_EQ(c(min_sub / 4), 0x00u);
  EXPECT_EQ(c(-FLT_TRUE_MIN), 0x80u);
  EXPECT_EQ(c(FLT_MIN), 0x00u);
  EXPECT_EQ(c(min_sub * 1.5f), 0x02u);  // tie between 1 and 2 subnormal steps: even is 2
  EXPECT_EQ(c(min_sub * 2.5f), 0x02u);
}
TEST(FloatTypes, Fp8E4m3SaturationNanZerosSubnormals) {
  expect_fp8_specials<fp8e4m3_t>(448.0f, 0x7eu, std::ldexp(1.0f, -9));
}
TEST(FloatTypes, Fp8E5m2SaturationNanZerosSubnormals) {
  expect_fp8_specials<fp8e5m2_t>(57344.0f, 0x7bu, std::ldexp(1.0f, -16));
}

TEST(FloatTypes, Bf16NarrowingMatchesNearestSearchOnRandomFloats) {
  expect_narrowing_matches_reference<bf16_t>(random_floats(size_t(1) << 21, 1602, -140, 127), "random");
}

template <class T>
void expect_fp8_random_checks(int min_exp, int max_exp, uint64_t seed) {
  std::vector<float> xs = random_floats(size_t(1) << 20, seed, min_exp, max_exp);
  expect_narrowing_matches_reference<T>(xs, "random vs grid reference");
  int bad = 0;
  for (size_t i = 0; i < xs.size(); i += 3) {  // the exhaustive search is slow: a third of the sample
    uint32_t got = code_of(narrow<T>(xs[i]));
    uint32_t ref = exhaustive_nearest_fp8<T>(xs[i]);
    if (got != ref && bad++ < 10)
      ADD_FAILURE() << std::hex << "float 0x" << bits(xs[i]) << " (" << xs[i] << ") -> 0x" << got
                    << " exhaustive search 0x" << ref;
  }
  EXPECT_EQ(bad, 0);
}
TEST(FloatTypes, Fp8E4m3NarrowingMatchesExhaustiveSearch) { expect_fp8_random_checks<fp8e4m3_t>(-14, 10, 1603); }
TEST(FloatTypes, Fp8E5m2NarrowingMatchesExhaustiveSearch) { expect_fp8_random_checks<fp8e5m2_t>(-20, 17, 1604); }

// Narrowing is monotone: x <= y implies narrow(x) <= narrow(y) as values.
template <class T>
void expect_monotone(int min_exp, int max_exp, uint64_t seed) {
  std::vector<float> xs = random_floats(size_t(1) << 20, seed, min_exp, max_exp);
  std::erase_if(xs, [](float x) { return std::isnan(x); });
  std::sort(xs.begin(), xs.end());
  int bad = 0;
  for (size_t i = 1; i < xs.size(); ++i) {
    float a = to_float(narrow<T>(xs[i - 1])), b = to_float(narrow<T>(xs[i]));
    if (!(a <= b) && bad++ < 10) ADD_FAILURE() << xs[i - 1] << " -> " << a << " but " << xs[i] << " -> " << b;
  }
  EXPECT_EQ(bad, 0);
}
TEST(FloatTypes, NarrowingIsMonotone) {
  expect_monotone<bf16_t>(-140, 127, 1605);
  expect_monotone<fp16_t>(-30, 18, 1606);
  expect_monotone<fp8e4m3_t>(-14, 10, 1607);
  expect_monotone<fp8e5m2_t>(-20, 17, 1608);
}

TEST(FloatTypes, FromDoubleAndToDoubleGoThroughFp32) {
  EXPECT_EQ(to_double(fp8e4m3_t{0x7e}), 448.0);
  EXPECT_EQ(from_double<fp8e4m3_t>(1e10).bits, 0x7eu);
  EXPECT_EQ(from_double<fp8e5m2_t>(-1e10).bits, 0xfbu);
  EXPECT_EQ(from_double<bf16_t>(1.0).bits, 0x3f80u);
}

}  // namespace
}  // namespace megatron
