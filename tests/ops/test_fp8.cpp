// Tests of the fp8 family. The CPU reference is checked against formulas written out here: every fp8 code
// of the cast is found by a search over all codes of the format (values from the bit layout, nearest with
// ties to the even code, saturating), on products formed as the contract says; the amax, the scale rule and
// the history roll are checked element by element. The CUDA kernels must then give the CPU's bits exactly,
// on the vector and the element paths (aligned and unaligned views, odd shapes, partial tiles), for every
// selection of outputs.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/ops/fp8/fp8.h"

using ::megatron::testing::expect_error;

namespace megatron {
namespace {

using enum DType;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Context& cpu() { return testing::cpu_context(); }

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------- the direct reference of the cast

struct Fp8Format {
  DType dtype;
  int mant_bits, bias, max_code;
  const char* name;
};
const Fp8Format kE4M3{F8E4M3, 3, 7, 0x7e, "e4m3"};
const Fp8Format kE5M2{F8E5M2, 2, 15, 0x7b, "e5m2"};

// The value of magnitude code m from the bit layout: subnormal frac * 2^(1 - bias - M), normal
// (1 + frac / 2^M) * 2^(e - bias).
double code_value(const Fp8Format& f, int m) {
  const int e = m >> f.mant_bits, frac = m & ((1 << f.mant_bits) - 1);
  if (e == 0) return std::ldexp(double(frac), 1 - f.bias - f.mant_bits);
  return std::ldexp(1.0 + std::ldexp(double(frac), -f.mant_bits), e - f.bias);
}

// The code of p: NaN -> 0x7F; else the nearest finite code by search (ties to the even code), beyond the
// largest finite value the largest, with p's sign (zeros included).
uint8_t reference_code(const Fp8Format& f, float p) {
  if (std::isnan(p)) return 0x7f;
  const uint8_t sign = std::signbit(p) ? 0x80 : 0x00;
  const double a = std::fabs(double(p));
  int best = f.max_code;
  if (a < code_value(f, f.max_code)) {
    best = 0;
    double best_d = a;
    for (int m = 1; m <= f.max_code; ++m) {
      const double d = std::fabs(code_value(f, m) - a);
      if (d < best_d || (d == best_d && m % 2 == 0)) best = m, best_d = d;
    }
  }
  return uint8_t(sign | best);
}

// in[i] * scale as the contract forms it: fp32 product of the widened input, or fp64 narrowed to fp32.
float reference_product(const Tensor& in, int64_t i, float scale) {
  switch (in.dtype()) {
    case F64: return float(in.data<double>()[i] * double(scale));
    case F32: return in.data<float>()[i] * scale;
    case BF16: return to_float(in.data<bf16_t>()[i]) * scale;
    default: return to_float(in.data<fp16_t>()[i]) * scale;
  }
}
float reference_abs(const Tensor& in, int64_t i) {
  switch (in.dtype()) {
    case F64: return float(std::fabs(in.data<double>()[i]));
    case F32: return std::fabs(in.data<float>()[i]);
    case BF16: return std::fabs(to_float(in.data<bf16_t>()[i]));
    default: return std::fabs(to_float(in.data<fp16_t>()[i]));
  }
}

// amax's contract: NaN in the input -> 0x7FFFFFFF; a positive NaN on entry stays; a negative entry
// (number or NaN) counts as below 0; else the larger of the entry and max |in|.
uint32_t reference_amax(const Tensor& in, uint32_t start) {
  float m = 0.0f;
  for (int64_t i = 0; i < in.numel(); ++i) {
    const float a = reference_abs(in, i);
    if (std::isnan(a)) return 0x7fffffffu;
    m = std::max(m, a);
  }
  if (start & 0x80000000u) return bits_of(m);
  if (std::isnan(float_of(start))) return start;
  return bits_of(std::max(m, float_of(start)));
}

// ---------------------------------------------------------------- inputs and runs

// sign * u * 2^e with u in [1, 2) and e in [-22, 14] (f16 still finite): with the scales used, products
// cover fp8's subnormals, normals and saturation. With `specials`, NaN, +-inf and +-0 appear too.
Tensor random_input(int64_t rows, int64_t cols, DType dtype, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mant(1.0, 2.0), expo(-22.0, 14.0), coin(0.0, 1.0);
  const float kSpecial[] = {kNaN, kInf, -kInf, 0.0f, -0.0f};
  Tensor t = cpu().empty(Shape{rows, cols}, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = (coin(rng) < 0.5 ? -1.0 : 1.0) * mant(rng) * std::ldexp(1.0, int(std::floor(expo(rng))));
    if (specials && i % 23 == 7) v = kSpecial[(i / 23) % 5];
    switch (dtype) {
      case F64: t.data<double>()[i] = v * (1.0 + 1e-12 * coin(rng)); break;  // bits beyond fp32
      case F32: t.data<float>()[i] = float(v); break;
      case BF16: t.data<bf16_t>()[i] = from_float<bf16_t>(float(v)); break;
      default: t.data<fp16_t>()[i] = from_float<fp16_t>(float(v)); break;
    }
  }
  return t;
}

Tensor fresh(Context& ctx, const Shape& shape, DType dtype, bool unaligned) {
  const int64_t n = shape.numel(), skip = unaligned ? 1 : 0;
  Tensor t = ctx.empty(Shape{n + skip}, dtype).slice(skip, n + skip).view(shape.dims());
  testing::poison(ctx, t);  // every code is written, and 0xFF is never one the cast makes
  return t;
}
std::vector<uint8_t> bytes_of(Context& ctx, const Tensor& t) {
  Tensor h = cpu().empty(t.shape(), t.dtype());
  copy_tensor(ctx, h, t);
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.nbytes());
}
Tensor f32_on(Context& ctx, const std::vector<float>& values) {
  Tensor h = cpu().empty(Shape{int64_t(values.size())}, F32);
  std::copy(values.begin(), values.end(), h.data<float>());
  return testing::copy_on(ctx, h);
}

struct CastRequest {
  Fp8Format fmt = kE4M3;
  float scale = 1.0f;
  bool want_out = true, want_out_t = true, want_amax = true;
  uint32_t amax_start = 0;
  bool unaligned_in = false, unaligned_out = false;
};
struct CastResult {
  std::vector<uint8_t> out, out_t;
  uint32_t amax = 0;
};

CastResult run_cast(Context& ctx, const Tensor& host_in, const CastRequest& q) {
  const int64_t rows = host_in.dim(0), cols = host_in.dim(1);
  Tensor in = testing::copy_on(ctx, host_in, q.unaligned_in);
  Tensor out = q.want_out ? fresh(ctx, Shape{rows, cols}, q.fmt.dtype, q.unaligned_out) : Tensor();
  Tensor out_t = q.want_out_t ? fresh(ctx, Shape{cols, rows}, q.fmt.dtype, q.unaligned_out) : Tensor();
  Tensor amax = q.want_amax ? f32_on(ctx, {float_of(q.amax_start)}) : Tensor();
  ops::fp8_cast_transpose(ctx, out, out_t, amax, in, f32_on(ctx, {q.scale}));
  CastResult r;
  if (q.want_out) r.out = bytes_of(ctx, out);
  if (q.want_out_t) r.out_t = bytes_of(ctx, out_t);
  if (q.want_amax) {
    std::vector<uint8_t> b = bytes_of(ctx, amax);
    std::memcpy(&r.amax, b.data(), 4);
  }
  return r;
}

std::string describe(const Tensor& in, const CastRequest& q) {
  return str_cat(dtype_name(in.dtype()), "[", in.dim(0), ", ", in.dim(1), "] -> ", q.fmt.name, " scale ", q.scale,
                 q.want_out ? " out" : "", q.want_out_t ? " out_t" : "", q.unaligned_in ? " unaligned-in" : "",
                 q.unaligned_out ? " unaligned-out" : "");
}

// Every requested output against the direct reference; reports the first few mismatches.
void expect_matches_reference(const Tensor& host_in, const CastRequest& q, const CastResult& got) {
  const int64_t rows = host_in.dim(0), cols = host_in.dim(1);
  int failures = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols && failures < 5; ++c) {
      const float p = reference_product(host_in, r * cols + c, q.scale);
      const uint8_t want = reference_code(q.fmt, p);
      if (q.want_out && got.out[r * cols + c] != want) {
        ++failures;
        ADD_FAILURE() << describe(host_in, q) << ": out[" << r << ", " << c << "] = " << int(got.out[r * cols + c])
                      << ", want " << int(want) << " (product " << p << ")";
      }
      if (q.want_out_t && got.out_t[c * rows + r] != want) {
        ++failures;
        ADD_FAILURE() << describe(host_in, q) << ": out_t[" << c << ", " << r << "] = " << int(got.out_t[c * rows + r])
                      << ", want " << int(want) << " (product " << p << ")";
      }
    }
  }
  if (q.want_amax) {
    EXPECT_EQ(got.amax, reference_amax(host_in, q.amax_start)) << describe(host_in, q) << ": amax bits";
  }
}

const DType kCpuInputs[] = {F32, BF16, F16, F64};
const Shape kOddShapes[] = {Shape{1, 1}, Shape{3, 5}, Shape{37, 129}, Shape{130, 64}};

// ---------------------------------------------------------------- CPU: the cast against the direct reference

TEST(Fp8ReferenceAnchors, KnownCodes) {
  // The reference search itself, on values whose codes are known by hand.
  EXPECT_EQ(code_value(kE4M3, 0x7e), 448.0);
  EXPECT_EQ(code_value(kE5M2, 0x7b), 57344.0);
  EXPECT_EQ(code_value(kE4M3, 0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(code_value(kE5M2, 0x01), std::ldexp(1.0, -16));
  const float v[] = {kNaN, kInf, -kInf, 0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, 1.0625f, 1.1875f, 464.0f, -1e6f};
  const uint8_t e4m3[] = {0x7f, 0x7e, 0xfe, 0x00, 0x80, 0x00, 0x80, 0x38, 0x38, 0x3a, 0x7e, 0xfe};
  const uint8_t e5m2[] = {0x7f, 0x7b, 0xfb, 0x00, 0x80, 0x00, 0x80, 0x3c, 0x3c, 0x3d, 0x5f, 0xfb};
  Tensor in = cpu().empty(Shape{1, 12}, F32);
  std::memcpy(in.data_ptr(), v, sizeof(v));
  for (const Fp8Format& f : {kE4M3, kE5M2}) {
    const uint8_t* want = f.dtype == F8E4M3 ? e4m3 : e5m2;
    CastRequest q{.fmt = f};
    CastResult got = run_cast(cpu(), in, q);
    for (int i = 0; i < 12; ++i) {
      EXPECT_EQ(int(reference_code(f, v[i])), int(want[i])) << f.name << " reference of " << v[i];
      EXPECT_EQ(int(got.out[i]), int(want[i])) << f.name << " op on " << v[i];
      EXPECT_EQ(int(got.out_t[i]), int(want[i])) << f.name << " op (out_t) on " << v[i];
    }
    EXPECT_EQ(got.amax, 0x7fffffffu) << "NaN input: the canonical NaN";
  }
}

TEST(Fp8CastTranspose, MatchesDirectReference) {
  uint64_t seed = 1;
  for (DType dt : kCpuInputs)
    for (const Fp8Format& f : {kE4M3, kE5M2})
      for (const Shape& s : kOddShapes)
        for (float scale : {1.0f, 37.5f, 3e5f, 1.0f / 1024}) {  // 3e5: most products saturate
          Tensor in = random_input(s[0], s[1], dt, seed++, /*specials=*/false);
          CastRequest q{.fmt = f, .scale = scale};
          expect_matches_reference(in, q, run_cast(cpu(), in, q));
        }
}

TEST(Fp8CastTranspose, NanInfAndZerosInTheInput) {
  uint64_t seed = 100;
  for (DType dt : kCpuInputs)
    for (const Fp8Format& f : {kE4M3, kE5M2})
      for (const Shape& s : {Shape{37, 129}, Shape{130, 64}}) {
        Tensor in = random_input(s[0], s[1], dt, seed++, /*specials=*/true);
        CastRequest q{.fmt = f, .scale = 37.5f, .amax_start = bits_of(2.0f)};
        CastResult got = run_cast(cpu(), in, q);
        expect_matches_reference(in, q, got);
        EXPECT_EQ(got.amax, 0x7fffffffu);
      }
}

TEST(Fp8CastTranspose, EachOutputAlone) {
  Tensor in = random_input(37, 129, BF16, 7, true);
  const CastRequest both{.fmt = kE5M2, .scale = 300.0f};
  const CastResult all = run_cast(cpu(), in, both);
  CastRequest out_only = both, out_t_only = both, no_amax = both;
  out_only.want_out_t = false;
  out_t_only.want_out = false;
  no_amax.want_amax = false;
  EXPECT_EQ(run_cast(cpu(), in, out_only).out, all.out);
  EXPECT_EQ(run_cast(cpu(), in, out_only).amax, all.amax);
  EXPECT_EQ(run_cast(cpu(), in, out_t_only).out_t, all.out_t);
  EXPECT_EQ(run_cast(cpu(), in, out_t_only).amax, all.amax);
  EXPECT_EQ(run_cast(cpu(), in, no_amax).out, all.out);
  EXPECT_EQ(run_cast(cpu(), in, no_amax).out_t, all.out_t);
  expect_matches_reference(in, out_only, run_cast(cpu(), in, out_only));
  expect_matches_reference(in, out_t_only, run_cast(cpu(), in, out_t_only));
}

TEST(Fp8CastTranspose, AmaxAccumulatesAcrossCalls) {
  Tensor a = random_input(9, 11, F32, 21, false), b = random_input(13, 5, F32, 22, false);
  a.data<float>()[17] = 30000.0f;  // above every random value (< 2^14); the larger maximum comes second or first
  b.data<float>()[3] = -50000.0f;
  for (bool b_first : {false, true}) {
    Tensor amax = f32_on(cpu(), {0.0f}), scale = f32_on(cpu(), {1.0f});
    Tensor oa = cpu().empty(Shape{9, 11}, F8E4M3), ob = cpu().empty(Shape{13, 5}, F8E4M3);
    ops::fp8_cast_transpose(cpu(), b_first ? ob : oa, Tensor(), amax, b_first ? b : a, scale);
    ops::fp8_cast_transpose(cpu(), b_first ? oa : ob, Tensor(), amax, b_first ? a : b, scale);
    EXPECT_EQ(amax.data<float>()[0], 50000.0f);
  }
  // What amax[0] holds on entry: a larger value stays, a negative number or NaN counts as below 0, a
  // positive NaN stays, NaN in the input wins.
  Tensor nan_in = random_input(4, 4, F32, 23, false);
  nan_in.data<float>()[5] = kNaN;
  struct Entry {
    uint32_t start;
    const Tensor* in;
    uint32_t want;
  } entries[] = {{bits_of(1e30f), &a, bits_of(1e30f)},       {bits_of(-1.0f), &a, bits_of(30000.0f)},
                 {0xffffffffu, &a, bits_of(30000.0f)},          {bits_of(-0.0f), &a, bits_of(30000.0f)},
                 {0x7fc00000u, &a, 0x7fc00000u},               {0x7fc00000u, &nan_in, 0x7fffffffu},
                 {bits_of(kInf), &a, bits_of(kInf)},           {bits_of(1e30f), &nan_in, 0x7fffffffu}};
  for (const Entry& e : entries) {
    CastRequest q{.want_out_t = false, .amax_start = e.start};
    EXPECT_EQ(run_cast(cpu(), *e.in, q).amax, e.want) << std::hex << "start 0x" << e.start;
    EXPECT_EQ(reference_amax(*e.in, e.start), e.want) << std::hex << "reference, start 0x" << e.start;
  }
}

TEST(Fp8CastTranspose, EmptyInputLeavesAmax) {
  for (const Shape& s : {Shape{0, 5}, Shape{5, 0}, Shape{0, 0}}) {
    Tensor in = cpu().empty(s, BF16), amax = f32_on(cpu(), {3.0f}), scale = f32_on(cpu(), {1.0f});
    ops::fp8_cast_transpose(cpu(), cpu().empty(s, F8E4M3), cpu().empty(Shape{s[1], s[0]}, F8E4M3), amax, in, scale);
    EXPECT_EQ(amax.data<float>()[0], 3.0f);
  }
}

TEST(Fp8CastTranspose, SameBitsForEveryThreadCount) {
  Tensor in = random_input(300, 700, BF16, 31, true);
  const CastRequest q{.fmt = kE4M3, .scale = 50.0f};
  std::vector<CastResult> runs;
  for (int threads : testing::kThreadCounts) {
    testing::ScopedCpuThreads scoped(threads);
    runs.push_back(run_cast(cpu(), in, q));
  }
  for (size_t k = 1; k < runs.size(); ++k) {
    EXPECT_EQ(runs[k].out, runs[0].out);
    EXPECT_EQ(runs[k].out_t, runs[0].out_t);
    EXPECT_EQ(runs[k].amax, runs[0].amax);
  }
  expect_matches_reference(in, q, runs[0]);
}

TEST(Fp8CastTranspose, RejectsBadArguments) {
  Tensor in = cpu().empty(Shape{4, 6}, BF16), scale = f32_on(cpu(), {1.0f}), amax = f32_on(cpu(), {0.0f});
  Tensor out = cpu().empty(Shape{4, 6}, F8E4M3), out_t = cpu().empty(Shape{6, 4}, F8E4M3);
  auto call = [&](const Tensor& o, const Tensor& ot, const Tensor& m, const Tensor& x, const Tensor& s) {
    return [&, o, ot, m, x, s] { ops::fp8_cast_transpose(cpu(), o, ot, m, x, s); };
  };
  expect_error(call(Tensor(), Tensor(), amax, in, scale), {"fp8_cast_transpose", "out", "out_t"});
  expect_error(call(out_t, Tensor(), amax, in, scale), {"fp8_cast_transpose", "out", "[4, 6]"});
  expect_error(call(Tensor(), out, amax, in, scale), {"fp8_cast_transpose", "out_t", "[6, 4]"});
  expect_error(call(cpu().empty(Shape{4, 6}, BF16), Tensor(), amax, in, scale), {"fp8_cast_transpose", "out", "bf16"});
  expect_error(call(out, cpu().empty(Shape{6, 4}, F8E5M2), amax, in, scale), {"fp8_cast_transpose", "out_t", "e5m2"});
  expect_error(call(out, out_t, cpu().empty(Shape{2}, F32), in, scale), {"fp8_cast_transpose", "amax", "[1]"});
  expect_error(call(out, out_t, amax, in, cpu().empty(Shape{1}, BF16)), {"fp8_cast_transpose", "scale", "f32"});
  expect_error(call(out, out_t, amax, cpu().empty(Shape{4, 6}, I32), scale), {"fp8_cast_transpose", "in", "i32"});
  expect_error(call(out, out_t, amax, cpu().empty(Shape{24}, BF16), scale), {"fp8_cast_transpose", "in"});
  Tensor flat = cpu().empty(Shape{48}, F8E4M3);
  expect_error(call(flat.slice(0, 24).view({4, 6}), flat.slice(20, 44).view({6, 4}), amax, in, scale),
               {"fp8_cast_transpose", "out", "out_t", "overlaps"});
  expect_error(call(out, out_t, scale, in, scale), {"fp8_cast_transpose", "amax", "scale", "overlaps"});
}

// ---------------------------------------------------------------- CPU: the scale ops against formulas

// fp8_scale_from_amax's rule, written from the contract.
float reference_scale(float amax, float previous, float fp8_max, int margin, bool keep_on_invalid) {
  if (std::isnan(amax) || std::isinf(amax) || amax <= 0.0f) return keep_on_invalid ? previous : 1.0f;
  const float s = (fp8_max / amax) / std::ldexp(1.0f, margin);
  return std::isinf(s) ? FLT_MAX : s;
}

const std::vector<float> kAmaxes = {1.0f,  3.7f, 448.0f, 57344.0f, 1e-3f, 0.0f,  -0.0f, kInf,  -kInf,
                                    kNaN, 1e-38f, 1e-45f, 3e38f,   -2.0f, 0.25f, 7e-3f, 1.5e4f};

TEST(Fp8Scale, FromAmaxMatchesTheFormula) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> prev(0.5f, 4.0f);
  for (float fp8_max : {448.0f, 57344.0f})
    for (int margin : {0, 2, -1})
      for (bool keep : {true, false}) {
        std::vector<float> previous(kAmaxes.size());
        for (float& p : previous) p = prev(rng);
        Tensor amax = f32_on(cpu(), kAmaxes), scale = f32_on(cpu(), previous), inv = f32_on(cpu(), previous);
        ops::fp8_scale_from_amax(cpu(), scale, inv, amax, fp8_max, margin, keep);
        for (size_t i = 0; i < kAmaxes.size(); ++i) {
          const float want = reference_scale(kAmaxes[i], previous[i], fp8_max, margin, keep);
          EXPECT_EQ(bits_of(scale.data<float>()[i]), bits_of(want)) << "amax " << kAmaxes[i] << " margin " << margin;
          EXPECT_EQ(bits_of(inv.data<float>()[i]), bits_of(1.0f / want)) << "amax " << kAmaxes[i];
        }
      }
  // Anchors: amax = fp8_max gives 1, a margin of 2 divides by 4, a tiny amax gives FLT_MAX, 0 gives 1.
  Tensor amax = f32_on(cpu(), {448.0f, 1.0f, 1e-38f, 0.0f}), scale = f32_on(cpu(), {9, 9, 9, 9});
  Tensor inv = f32_on(cpu(), {0, 0, 0, 0});
  ops::fp8_scale_from_amax(cpu(), scale, inv, amax, 448.0f, 2, false);
  EXPECT_EQ(scale.data<float>()[0], 0.25f);
  EXPECT_EQ(scale.data<float>()[1], 112.0f);
  EXPECT_EQ(scale.data<float>()[2], FLT_MAX);
  EXPECT_EQ(scale.data<float>()[3], 1.0f);
  EXPECT_EQ(inv.data<float>()[0], 4.0f);
  EXPECT_EQ(inv.data<float>()[2], 1.0f / FLT_MAX);
}

// A history [L, n] of positive amaxes with columns that exercise the rules: 0 / inf / NaN / tiny newest
// amaxes, a NaN or a large value in an older row, an all-zero column.
Tensor history_input(int64_t L, int64_t n, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_real_distribution<float> u(0.01f, 100.0f);
  Tensor h = cpu().empty(Shape{L, n}, F32);
  float* p = h.data<float>();
  for (int64_t i = 0; i < L * n; ++i) p[i] = u(rng);
  auto at = [&](int64_t r, int64_t c) -> float& { return p[(r % L) * n + c % n]; };
  at(0, 1) = 0.0f;
  at(0, 2) = kInf;
  at(0, 3) = kNaN;
  at(0, 4) = 1e-39f;
  at(L - 1, 5) = kNaN;
  at(L - 1, 6) = 1e4f;
  for (int64_t r = 0; r < L; ++r) at(r, 7) = 0.0f;
  return h;
}

TEST(Fp8Scale, DelayedUpdateRollsTheHistoryAndScales) {
  const int64_t n = 9;
  for (int64_t L : {1, 3, 5})
    for (bool use_max : {false, true})
      for (int margin : {0, 2}) {
        const Tensor old = history_input(L, n, uint64_t(L * 10 + margin));
        Tensor h = testing::copy_on(cpu(), old), scale = f32_on(cpu(), std::vector<float>(n, 2.5f));
        Tensor inv = f32_on(cpu(), std::vector<float>(n, 0.0f));
        ops::fp8_delayed_scaling_update(cpu(), h, scale, inv, 448.0f, margin, use_max);
        const float* o = old.data<float>();
        for (int64_t i = 0; i < n; ++i) {
          float amax = o[i];
          for (int64_t r = 1; use_max && r < L; ++r)  // torch.max: NaN anywhere gives NaN
            amax = std::isnan(amax) || std::isnan(o[r * n + i]) ? kNaN : std::max(amax, o[r * n + i]);
          const float want = reference_scale(amax, 2.5f, 448.0f, margin, true);
          const std::string where = str_cat("L ", L, " use_max ", use_max, " margin ", margin, " column ", i);
          EXPECT_EQ(bits_of(scale.data<float>()[i]), bits_of(want)) << where;
          EXPECT_EQ(bits_of(inv.data<float>()[i]), bits_of(1.0f / want)) << where;
          for (int64_t r = 0; r < L; ++r) {
            const float want_h = r == 0 ? 0.0f : o[((r + 1) % L) * n + i];  // torch.roll(h, -1, 0), then row 0 = 0
            EXPECT_EQ(bits_of(h.data<float>()[r * n + i]), bits_of(want_h)) << where << " row " << r;
          }
        }
      }
}

TEST(Fp8Scale, RejectsBadArguments) {
  Tensor a = f32_on(cpu(), {1, 2, 3}), s = f32_on(cpu(), {1, 1, 1}), si = f32_on(cpu(), {1, 1, 1});
  Tensor h = cpu().empty(Shape{4, 3}, F32);
  expect_error([&] { ops::fp8_scale_from_amax(cpu(), f32_on(cpu(), {1, 1}), si, a, 448.0f, 0, true); },
               {"fp8_scale_from_amax", "scale", "[3]"});
  expect_error([&] { ops::fp8_scale_from_amax(cpu(), s, s, a, 448.0f, 0, true); },
               {"fp8_scale_from_amax", "scale_inv", "overlaps"});
  expect_error([&] { ops::fp8_scale_from_amax(cpu(), s, si, a, 0.0f, 0, true); }, {"fp8_scale_from_amax", "fp8_max"});
  expect_error([&] { ops::fp8_scale_from_amax(cpu(), s, si, a, kInf, 0, true); }, {"fp8_scale_from_amax", "fp8_max"});
  expect_error([&] { ops::fp8_scale_from_amax(cpu(), s, si, a, 448.0f, 200, true); },
               {"fp8_scale_from_amax", "margin", "200"});
  expect_error([&] { ops::fp8_delayed_scaling_update(cpu(), cpu().empty(Shape{0, 3}, F32), s, si, 448.0f, 0, true); },
               {"fp8_delayed_scaling_update", "history", "row"});
  expect_error([&] { ops::fp8_delayed_scaling_update(cpu(), cpu().empty(Shape{12}, F32), s, si, 448.0f, 0, true); },
               {"fp8_delayed_scaling_update", "history"});
  expect_error([&] { ops::fp8_delayed_scaling_update(cpu(), h, f32_on(cpu(), {1, 1}), si, 448.0f, 0, true); },
               {"fp8_delayed_scaling_update", "scale", "[3]"});
  expect_error([&] { ops::fp8_delayed_scaling_update(cpu(), h, s, si, 448.0f, -127, true); },
               {"fp8_delayed_scaling_update", "margin"});
}

// ---------------------------------------------------------------- CUDA: the CPU's bits exactly

// Full and partial tiles; rows % 16 == 0 or not (16-byte out_t stores or bytes); cols a multiple of 8, of 4
// only (the f32 vector path but not bf16's) or neither.
const Shape kGpuShapes[] = {Shape{1, 1},     Shape{3, 5},     Shape{37, 129},  Shape{130, 64},  Shape{128, 128},
                            Shape{200, 136}, Shape{1000, 24}, Shape{24, 1000}, Shape{256, 384}, Shape{257, 4096},
                            Shape{144, 200}, Shape{48, 1000}, Shape{64, 36}};

void expect_cuda_cast_matches_cpu(const Tensor& in, const CastRequest& q) {
  const CastResult want = run_cast(cpu(), in, q), got = run_cast(testing::cuda_context(), in, q);
  EXPECT_EQ(got.out, want.out) << describe(in, q);
  EXPECT_EQ(got.out_t, want.out_t) << describe(in, q);
  EXPECT_EQ(got.amax, want.amax) << std::hex << describe(in, q) << ": amax bits";
}

TEST(Fp8CastTransposeGpu, BitIdenticalToCpu) {
  MEGATRON_REQUIRE_GPU();
  uint64_t seed = 1000;
  for (DType dt : {F32, BF16, F16})
    for (const Fp8Format& f : {kE4M3, kE5M2})
      for (const Shape& s : kGpuShapes) {
        const Tensor plain = random_input(s[0], s[1], dt, seed++, false);
        const Tensor special = random_input(s[0], s[1], dt, seed++, true);
        expect_cuda_cast_matches_cpu(plain, CastRequest{.fmt = f, .scale = 37.5f});
        expect_cuda_cast_matches_cpu(special, CastRequest{.fmt = f, .scale = 3e5f, .amax_start = bits_of(0.5f)});
        expect_cuda_cast_matches_cpu(plain,
                                     CastRequest{.fmt = f, .scale = 1.0f, .want_out_t = false, .unaligned_in = true});
        expect_cuda_cast_matches_cpu(plain, CastRequest{.fmt = f, .scale = 1.0f / 64, .want_out = false,
                                                        .amax_start = 0xffffffffu, .unaligned_out = true});
        expect_cuda_cast_matches_cpu(special, CastRequest{.fmt = f, .scale = 2.0f, .want_amax = false,
                                                          .unaligned_in = true, .unaligned_out = true});
      }
}

TEST(Fp8CastTransposeGpu, AmaxAccumulatesAcrossCallsAndBlocks) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  Tensor a = random_input(300, 512, BF16, 41, false), b = random_input(64, 4096, BF16, 42, false);
  b.data<bf16_t>()[64 * 4096 - 1] = from_float<bf16_t>(-70000.0f);  // the last element of the last tile
  Tensor amax = f32_on(gpu, {0.0f}), scale = f32_on(gpu, {1.0f});
  ops::fp8_cast_transpose(gpu, gpu.empty(Shape{300, 512}, F8E4M3), Tensor(), amax, testing::copy_on(gpu, a), scale);
  ops::fp8_cast_transpose(gpu, Tensor(), gpu.empty(Shape{4096, 64}, F8E4M3), amax, testing::copy_on(gpu, b), scale);
  EXPECT_EQ(read_scalar(gpu, amax), double(to_float(from_float<bf16_t>(70000.0f))));
}

TEST(Fp8CastTransposeGpu, RejectsF64Input) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  Tensor in = gpu.empty(Shape{4, 4}, F64);
  Tensor out = gpu.empty(Shape{4, 4}, F8E4M3), scale = f32_on(gpu, {1.0f});
  expect_error([&] { ops::fp8_cast_transpose(gpu, out, Tensor(), Tensor(), in, scale); },
               {"fp8_cast_transpose", "in", "f64"});
}

TEST(Fp8ScaleGpu, FromAmaxBitIdenticalToCpu) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  std::vector<float> amaxes = kAmaxes, previous;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(1e-3f, 1e3f);
  while (amaxes.size() < 700) amaxes.push_back(u(rng));  // more than two blocks of threads
  for (size_t i = 0; i < amaxes.size(); ++i) previous.push_back(u(rng));
  for (float fp8_max : {448.0f, 57344.0f})
    for (int margin : {0, 2, -3})
      for (bool keep : {true, false}) {
        std::vector<std::vector<uint8_t>> results[2];
        for (int dev = 0; dev < 2; ++dev) {
          Context& ctx = dev == 0 ? cpu() : gpu;
          Tensor amax = f32_on(ctx, amaxes), scale = f32_on(ctx, previous), inv = f32_on(ctx, previous);
          ops::fp8_scale_from_amax(ctx, scale, inv, amax, fp8_max, margin, keep);
          results[dev] = {bytes_of(ctx, scale), bytes_of(ctx, inv)};
        }
        EXPECT_EQ(results[1], results[0]) << "fp8_max " << fp8_max << " margin " << margin << " keep " << keep;
      }
}

TEST(Fp8ScaleGpu, DelayedUpdateBitIdenticalToCpu) {
  MEGATRON_REQUIRE_GPU();
  Context& gpu = testing::cuda_context();
  for (int64_t L : {1, 2, 3, 5, 64, 65, 100, 1024})
    for (int64_t n : {1, 9, 33, 300})
      for (bool use_max : {false, true}) {
        const Tensor old = history_input(L, n, uint64_t(L * 1000 + n));
        std::vector<float> previous(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) previous[size_t(i)] = 0.5f + float(i % 7);
        std::vector<std::vector<uint8_t>> results[2];
        for (int dev = 0; dev < 2; ++dev) {
          Context& ctx = dev == 0 ? cpu() : gpu;
          Tensor h = testing::copy_on(ctx, old), scale = f32_on(ctx, previous), inv = f32_on(ctx, previous);
          ops::fp8_delayed_scaling_update(ctx, h, scale, inv, 57344.0f, 1, use_max);
          results[dev] = {bytes_of(ctx, h), bytes_of(ctx, scale), bytes_of(ctx, inv)};
        }
        EXPECT_EQ(results[1], results[0]) << "L " << L << " n " << n << " use_max " << use_max;
      }
}

}  // namespace
}  // namespace megatron
