// The scalar arithmetic of the router ops, written once and compiled into both the CPU reference and the
// CUDA kernels, so that both evaluate the same operations in the same order. C is float (fp32 math for
// F32 / BF16 / F16 logits) or double (F64 logits, CPU only).
//
// Why not expf / log1pf: CUDA's and glibc's differ in the last bit, and a one-ulp difference in a score
// can swap two experts at a near-tie, so the selections of CPU and CUDA would disagree. exp_f32,
// log1p_f32 and log_f32 below are built from correctly rounded operations only (+, -, *, / in fp32 or
// fp64, with the device's explicit round-to-nearest intrinsics so that nvcc never contracts a*b+c into an
// FMA; the host compiles for baseline x86-64, which has none), so both sides get the same bits. Accuracy:
// exp_f32 about 1 ulp, the logs (evaluated in fp64, rounded once) half an ulp.
//
// Reductions over a row of E values use the lane order of a 32-lane warp (lane_order_*): lane l sums the
// elements l, l + 32, l + 64, ... in that order, then the 32 partial sums are combined by a butterfly
// (xor 16, 8, 4, 2, 1). The CUDA kernels compute exactly that with shuffles; the CPU reference emulates it
// (cpu_topk.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "megatron/core/float_types.h"  // MEGATRON_HD, detail::float_bits / bits_float

namespace megatron::ops::router_math {

inline constexpr int kLanes = 32;
// Added to the sum of the selected scores before normalising (Megatron's 1e-20, rounded to C).
inline constexpr double kNormEpsilon = 1e-20;
// softplus(x) = x above this (torch.nn.functional.softplus's threshold).
inline constexpr double kSoftplusThreshold = 20.0;

// ---- correctly rounded single operations, never contracted ----
MEGATRON_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MEGATRON_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MEGATRON_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MEGATRON_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MEGATRON_HD float sqrt_of(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
MEGATRON_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MEGATRON_HD double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
MEGATRON_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MEGATRON_HD double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
MEGATRON_HD double sqrt_of(double a) { return std::sqrt(a); }  // the F64 path: host only

MEGATRON_HD bool is_nan(float a) { return a != a; }
MEGATRON_HD bool is_nan(double a) { return a != a; }

// |v|, exact (the sign flipped, no rounding); NaN stays NaN.
template <class C>
MEGATRON_HD C magnitude(C v) {
  return v < C(0) ? -v : v;
}

// max that propagates NaN from either side (the same bits whatever the order, up to the NaN payload).
template <class C>
MEGATRON_HD C max_nan(C a, C b) {
  return (is_nan(a) || a > b) ? a : b;
}

// e^x: Cody-Waite reduction to |r| <= ln2/2 and a degree-7 Taylor polynomial (truncation ~5e-9, below
// fp32 rounding); 2^k applied in two halves so that subnormal and near-overflow results come out right.
// exp(-inf) = 0, overflow gives +inf, NaN stays NaN (the clamps compare, so NaN passes through them).
MEGATRON_HD float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 15 significant bits: k * kLn2Hi is exact for |k| < 512
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float xc = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : x);
  const float biased = add(mul(xc, kLog2e), kRound);
  const float kf = sub(biased, kRound);
  const int32_t k = int32_t(detail::float_bits(biased) - detail::float_bits(kRound));
  const float r = sub(sub(xc, mul(kf, kLn2Hi)), mul(kf, kLn2Lo));
  constexpr float kCoeff[] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                              1.0f / 6.0f,    0.5f,          1.0f,          1.0f};
  float p = kCoeff[0];
  for (int i = 1; i < 8; ++i) p = add(mul(p, r), kCoeff[i]);
  const int32_t k1 = k >> 1, k2 = k - k1;
  const float s1 = detail::bits_float(uint32_t(k1 + 127) << 23);
  const float s2 = detail::bits_float(uint32_t(k2 + 127) << 23);
  return mul(mul(p, s1), s2);
}

// log(1 + v) for v in [0, 1], in double: 2 atanh(s) with s = v / (2 + v) in [0, 1/3], the odd series
// to s^33 / 33 (the next term is below 2e-18 relative). About 1e-16 relative, so that rounding it to
// fp32 gives the correctly rounded result but for values within ~1e-16 of a rounding boundary.
MEGATRON_HD double log1p_core(double v) {
  const double s = div(v, add(2.0, v)), s2 = mul(s, s);
  double series = 1.0 / 33.0;
  for (int i = 15; i >= 0; --i) series = add(mul(series, s2), 1.0 / double(2 * i + 1));
  return mul(mul(2.0, s), series);
}

// log(1 + v) for v in [0, 1] (the softplus of a non-positive argument, v = exp(-|x|)); v == 0 gives 0.
MEGATRON_HD float log1p_f32(float v) { return float(log1p_core(double(v))); }

// log(w) for w >= 1 (a sum of exponentials whose largest term is 1: the z-loss's log-sum-exp): the binary
// exponent e taken off exactly, w = 2^e m with m in [1, 2), log w = e ln2 + log1p(m - 1) in double.
MEGATRON_HD float log_f32(float w) {
  constexpr double kLn2 = 0.6931471805599453094;
  if (!(w < 3.0e38f)) return w > 0 ? w : w - w;  // +inf stays inf, NaN stays NaN
  const uint32_t bits = detail::float_bits(w);
  const int32_t e = int32_t((bits >> 23) & 0xffu) - 127;
  const float m = detail::bits_float((bits & 0x7fffffu) | 0x3f800000u);
  return float(add(mul(double(e), kLn2), log1p_core(double(m) - 1.0)));
}

MEGATRON_HD double exp_of(double x) { return std::exp(x); }
MEGATRON_HD double log1p_of(double v) { return std::log1p(v); }
MEGATRON_HD double log_of(double w) { return std::log(w); }
MEGATRON_HD float exp_of(float x) { return exp_f32(x); }
MEGATRON_HD float log1p_of(float v) { return log1p_f32(v); }
MEGATRON_HD float log_of(float w) { return log_f32(w); }

// ---- score functions and their derivatives ----
template <class C>
MEGATRON_HD C sigmoid(C x) {
  return div(C(1), add(C(1), exp_of(-x)));
}

template <class C>
MEGATRON_HD C softplus(C x) {
  if (x > C(kSoftplusThreshold)) return x;
  const C a = x < C(0) ? -x : x;
  return add(x > C(0) ? x : C(0), log1p_of(exp_of(-a)));
}

template <class C>
MEGATRON_HD C sqrt_softplus(C x) {
  return sqrt_of(softplus(x));
}

// d sigmoid / dx from the score g = sigmoid(x).
template <class C>
MEGATRON_HD C sigmoid_grad(C g) {
  return mul(g, sub(C(1), g));
}

// d sqrt(softplus(x)) / dx = sigmoid(x) / (2 g), from x and g = sqrt(softplus(x)); 0 where g == 0 (the
// limit: both sigmoid(x) and g vanish there, g more slowly).
template <class C>
MEGATRON_HD C sqrt_softplus_grad(C x, C g) {
  return g == C(0) ? C(0) : div(sigmoid(x), mul(C(2), g));
}

// ---- the selection order ----
// Whether (a, ia) ranks before (b, ib): larger key first, NaN above every number, ties (and two NaNs) to
// the lower index. A total order on (key, index) pairs with distinct indices, so every way of finding the
// best element (serial scans, warp butterflies) finds the same one.
template <class C>
MEGATRON_HD bool ranks_before(C a, int ia, C b, int ib) {
  const bool na = is_nan(a), nb = is_nan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The sum of the m best of key[0 .. n) (m <= n), best first: a group's score in group-limited routing.
// Element i ranks as (key[i], i). O(m * n), no scratch.
template <class C>
MEGATRON_HD C top_sum(const C* key, int n, int m) {
  C sum = C(0);
  int last = -1;  // the previously taken element: the next is the best of those ranking after it
  for (int r = 0; r < m; ++r) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (last >= 0 && !ranks_before(key[last], last, key[i], i)) continue;
      if (best < 0 || ranks_before(key[i], i, key[best], best)) best = i;
    }
    sum = add(sum, key[best]);
    last = best;
  }
  return sum;
}

}  // namespace megatron::ops::router_math
