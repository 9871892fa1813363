// The narrow floating-point storage types and their conversions to and from fp32.
//
// Contract: every conversion here gives, bit for bit, what the CUDA intrinsics give on sm_90
// (__float2bfloat16, __float2half, __nv_cvt_float_to_fp8 with __NV_SATFINITE, and the widening casts):
// narrowing rounds to nearest even; fp8 saturates finite overflow (and inf) to the largest finite value;
// NaN stays NaN (narrowing gives the canonical NaN of the format: bf16/fp16 0x7FFF, fp8 0x7F; widening an
// fp16 or fp8 NaN gives 0x7FFFFFFF, widening bf16 is a plain shift). tests/core/test_float_types.cpp holds
// the CPU checks and tests/core/test_float_types_cuda.cu compares these against the intrinsics on every
// 8/16-bit pattern and on millions of random floats.
//
// The functions are usable from host and device code (MEGATRON_HD); device kernels usually prefer the
// native CUDA types, which have the same layout.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define MEGATRON_HD __host__ __device__ __forceinline__
#else
#define MEGATRON_HD inline
#endif

namespace megatron {

struct bf16_t { uint16_t bits; };
struct fp16_t { uint16_t bits; };
struct fp8e4m3_t { uint8_t bits; };  // OCP E4M3 ("fn"): no inf, NaN = S.1111.111, max 448
struct fp8e5m2_t { uint8_t bits; };  // OCP E5M2: IEEE-like, inf and NaN, max 57344

namespace detail {
MEGATRON_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
MEGATRON_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
}  // namespace detail

// ---- bf16 ----
MEGATRON_HD float to_float(bf16_t v) { return detail::bits_float(uint32_t(v.bits) << 16); }
MEGATRON_HD bf16_t bf16_from_float(float f) {
  uint32_t u = detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{0x7fff};  // canonical NaN, as cvt.rn.bf16.f32
  u += 0x7fffu + ((u >> 16) & 1u);                              // round to nearest even
  return bf16_t{uint16_t(u >> 16)};
}

// ---- fp16 ----
MEGATRON_HD float to_float(fp16_t v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) {
    // inf keeps its sign; every NaN widens to the canonical 0x7FFFFFFF (cvt.f32.f16, cuda_fp16.hpp)
    return detail::bits_float(mant == 0 ? (sign | 0x7f800000u) : 0x7fffffffu);
  }
  if (exp == 0) {
    if (mant == 0) return detail::bits_float(sign);
    // subnormal: mant * 2^-24, exact in fp32
    float mag = float(mant) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
MEGATRON_HD fp16_t fp16_from_float(float f) {
  uint32_t u = detail::float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16_t{0x7fff};                     // canonical NaN, as cvt.rn.f16.f32
  if (a >= 0x477ff000u) return fp16_t{uint16_t(sign | 0x7c00u)};   // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                          // below 2^-14: fp16 subnormal or zero
    uint32_t e = a >> 23;
    uint32_t shift = 126u - e;                                    // value / 2^-24 = m >> shift
    if (e == 0 || shift > 24) return fp16_t{sign};
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return fp16_t{uint16_t(sign | r)};
  }
  uint32_t r = (a - 0x38000000u) >> 13;                           // rebias 127 -> 15
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return fp16_t{uint16_t(sign | r)};
}

// ---- fp8 (implemented in fp8_convert.h) ----
MEGATRON_HD float to_float(fp8e4m3_t v);
MEGATRON_HD float to_float(fp8e5m2_t v);
MEGATRON_HD fp8e4m3_t fp8e4m3_from_float(float f);
MEGATRON_HD fp8e5m2_t fp8e5m2_from_float(float f);

// Generic narrowing: from_float<T>(x) for every storage type, identity for float and double.
template <class T> MEGATRON_HD T from_float(float f);
template <> MEGATRON_HD float from_float<float>(float f) { return f; }
template <> MEGATRON_HD bf16_t from_float<bf16_t>(float f) { return bf16_from_float(f); }
template <> MEGATRON_HD fp16_t from_float<fp16_t>(float f) { return fp16_from_float(f); }
template <> MEGATRON_HD fp8e4m3_t from_float<fp8e4m3_t>(float f) { return fp8e4m3_from_float(f); }
template <> MEGATRON_HD fp8e5m2_t from_float<fp8e5m2_t>(float f) { return fp8e5m2_from_float(f); }
MEGATRON_HD float to_float(float f) { return f; }

}  // namespace megatron

#include "megatron/core/fp8_convert.h"
