// fp8 E4M3 / E5M2 conversions; see float_types.h for the contract.
//
// Rules (those of cvt.rn.satfinite.{e4m3,e5m2}x2.f32 and cvt.rn.f16x2.{e4m3,e5m2}x2 followed by
// cvt.f32.f16 on sm_89+):
// - narrowing rounds to nearest, ties to even, in the normal and the subnormal range alike; anything that
//   rounds above the largest finite value, and +-inf, becomes +-max finite (448 / 57344); magnitudes up to
//   half the smallest subnormal (2^-10 / 2^-17) become a zero with the input's sign;
// - a NaN input becomes the positive NaN 0x7F in both formats (the sign and payload of the input are dropped);
// - widening is exact; every fp8 NaN (E4M3 S.1111.111, E5M2 S.11111.xx with xx != 0) widens to the fp32
//   canonical NaN 0x7FFFFFFF, as the fp8 -> fp16 -> fp32 path does.
#pragma once

namespace megatron {

namespace detail {

// Narrowing of the magnitude bits `a` (an fp32 without its sign, not NaN) to an fp8 magnitude code with
// kMant mantissa bits and exponent bias kBias, saturating to kMaxCode.
template <int kMant, int kBias, uint32_t kMaxCode>
MEGATRON_HD uint32_t fp8_magnitude_from_float_bits(uint32_t a) {
  constexpr uint32_t kDrop = 23u - kMant;                       // fp32 mantissa bits that do not fit
  constexpr uint32_t kMinNormalBits = uint32_t(127 + 1 - kBias) << 23;  // 2^(1 - bias)
  if (a >= 0x7f800000u) return kMaxCode;                        // +-inf saturates
  if (a >= kMinNormalBits) {
    // Rebias the exponent and round the mantissa; a carry out of the mantissa bumps the exponent, which
    // is exactly the next representable value.
    uint32_t r = (a - (uint32_t(127 - kBias) << 23)) >> kDrop;
    uint32_t rem = a & ((1u << kDrop) - 1u);
    uint32_t half = 1u << (kDrop - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return r > kMaxCode ? kMaxCode : r;
  }
  // Subnormal target: the code is value / 2^(1 - bias - kMant), rounded to nearest even. With the fp32
  // value m * 2^(e - 150) (m holding the implicit bit), that is m >> shift with shift below.
  uint32_t e = a >> 23;
  if (e == 0) return 0;                                         // fp32 subnormals are far below fp8's range
  uint32_t shift = uint32_t(151 - kBias - kMant) - e;
  if (shift >= 25u) return 0;                                   // below half the smallest subnormal
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t r = m >> shift;
  uint32_t rem = m & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;             // may carry into the smallest normal: correct
  return r;
}

// Widening of an fp8 magnitude code that is neither NaN nor inf.
template <int kMant, int kBias>
MEGATRON_HD float fp8_magnitude_to_float(uint32_t code) {
  uint32_t exp = code >> kMant;
  uint32_t mant = code & ((1u << kMant) - 1u);
  if (exp == 0) {
    // subnormal: mant * 2^(1 - bias - kMant), exact in fp32
    return float(mant) * bits_float(uint32_t(127 + 1 - kBias - kMant) << 23);
  }
  return bits_float(((exp + uint32_t(127 - kBias)) << 23) | (mant << (23 - kMant)));
}

}  // namespace detail

MEGATRON_HD float to_float(fp8e4m3_t v) {
  uint32_t sign = uint32_t(v.bits & 0x80u) << 24;
  uint32_t code = v.bits & 0x7fu;
  if (code == 0x7fu) return detail::bits_float(0x7fffffffu);
  return detail::bits_float(detail::float_bits(detail::fp8_magnitude_to_float<3, 7>(code)) | sign);
}

MEGATRON_HD float to_float(fp8e5m2_t v) {
  uint32_t sign = uint32_t(v.bits & 0x80u) << 24;
  uint32_t code = v.bits & 0x7fu;
  if (code > 0x7cu) return detail::bits_float(0x7fffffffu);
  if (code == 0x7cu) return detail::bits_float(sign | 0x7f800000u);
  return detail::bits_float(detail::float_bits(detail::fp8_magnitude_to_float<2, 15>(code)) | sign);
}

MEGATRON_HD fp8e4m3_t fp8e4m3_from_float(float f) {
  uint32_t u = detail::float_bits(f);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp8e4m3_t{0x7f};
  return fp8e4m3_t{uint8_t(((u >> 24) & 0x80u) | detail::fp8_magnitude_from_float_bits<3, 7, 0x7eu>(a))};
}

MEGATRON_HD fp8e5m2_t fp8e5m2_from_float(float f) {
  uint32_t u = detail::float_bits(f);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp8e5m2_t{0x7f};
  return fp8e5m2_t{uint8_t(((u >> 24) & 0x80u) | detail::fp8_magnitude_from_float_bits<2, 15, 0x7bu>(a))};
}

}  // namespace megatron
