// The scalar rules of OCP Microscaling (MX) block quantisation: the E8M0 block scale, the FP4 E2M1 element,
// the rule that picks a block's scale and the element conversions. Pure functions usable from host and
// device code (MEGATRON_HD), so that the CPU reference here and future Blackwell kernels compute the same
// bits; microscaling.h applies them to tensors.
//
// E8M0 (the scale): 8 bits, an unsigned biased exponent. Code c in [0, 254] is 2^(c - 127) (code 0 is
//   2^-127, an fp32 subnormal), code 255 is NaN. No zero, no sign, no mantissa.
// E2M1 (FP4, the element of MXFP4): S.EE.M, exponent bias 1. Codes 0..7 are the magnitudes
//   {0, 0.5, 1, 1.5, 2, 3, 4, 6} (exponent field 0 is the subnormal 0 / 0.5); bit 3 is the sign. No inf, no
//   NaN. Codes live in the low 4 bits of a uint8_t here; microscaling.h packs two per byte.
// E4M3 / E5M2 (the elements of MXFP8): the OCP fp8 formats of core/float_types.h (max 448 / 57344).
//
// Block scale, exactly Transformer Engine's MXFP8 cast (common/cast/mxfp8/quantize_mxfp8.cuh: the scale is
// ptx::float_to_e8m0(amax * Quantized_Limits<OType>::max_norm_rcp), common/util/ptx_arch_spec.cuh, with
// max_norm_rcp = float(1.0 / max_norm) from common/utils.cuh; its CPU reference in tests/cpp/test_common.h
// is the same; only kernels built with the optional _ENABLE_MXFMA round that reciprocal to bf16 / fp16):
//   amax = the largest |x| of the block's 32 elements in fp32, NaNs skipped (fmaxf from 0: a NaN never
//          reaches the scale, as TE's kernels' fmaxf and max.xorsign.abs do);
//   t    = amax * float(1 / max_elem)      one fp32 multiply, rounded to nearest;
//   code = e8m0_round_up(t)                the smallest power of two >= t, clamped to [2^-127, 2^127]:
//          t == 0 gives code 0, t == +inf gives 254 (satfinite: TE's float_to_e8m0, whose sm_100 form is
//          cvt.rp.satfinite.ue8m0x2.f32), a NaN t would give 255.
// For all three maxima this is 2^ceil(log2(amax / max_elem)) (clamped) for every finite amax but one: just
// above max_elem * 2^-127, t rounds down onto the subnormal 2^-127 (checked over all 2^31 finite amax), and
// that block's largest element rounds to max_elem. So no element exceeds max_elem once scaled, nothing clips
// beyond rounding; the price is up to one binade of the element range left unused.
//
// The same rule serves E2M1. TE has no MXFP4 kernel (its FP4 recipe is NVFP4: E4M3 scales over blocks of
// 16); its MXFP4 emulation (pytorch/custom_recipes/reference_nvfp4.py, pow_2_scales) takes
// 2^ceil(log2(amax / 6)) clamped to 2^+-127, the same round-up. The OCP MX v1.0 specification instead
// sets the shared exponent to floor(log2 amax) - emax_elem (emax_elem = 2, 8, 15 for E2M1, E4M3, E5M2) and
// saturates the elements that then exceed max_elem. With amax = m * 2^k (m in [1, 2)) the two agree when
// m <= max_elem / 2^emax_elem (1.5 for E2M1, 1.75 for E4M3 and E5M2); above it TE's scale is twice OCP's
// (OCP keeps one more bit of the small elements, TE never clips the large ones). We follow TE: the recipes
// this code prepares for are TE's, and checkpoints or tensors exchanged with it must carry the same scales.
//
// Elements: q = convert(x * 2^-e), the product one fp32 multiply by e8m0_reciprocal(code) (exact unless
// it falls below fp32's normal range, where the element rounds to zero anyway), the conversion round to
// nearest even with saturation to +-max_elem: cvt.rn.satfinite.{e4m3,e5m2,e2m1}x2.f32. For E4M3 / E5M2 that
// is fp8e4m3_from_float / fp8e5m2_from_float (a NaN becomes the fp8 NaN 0x7F); for E2M1, which has no NaN,
// a NaN becomes +6 (code 0x7, the rule of cuda_fp4.hpp's conversion) and +-inf becomes +-6.
// Dequantisation is decode(q) * 2^e, again one fp32 multiply (TE's dequantize_mxfp8.cuh), so a scale code
// of 255 makes the whole block NaN and a product above fp32's range becomes inf.
#pragma once

#include <cstdint>

#include "megatron/core/float_types.h"

namespace megatron::ops {

// The element formats of MX blocks.
enum class MxElement : uint8_t { E4M3, E5M2, E2M1 };

// Elements per block: one E8M0 scale per 32 consecutive elements of a row.
inline constexpr int64_t kMxBlock = 32;

inline const char* mx_element_name(MxElement element) {
  switch (element) {
    case MxElement::E4M3: return "e4m3";
    case MxElement::E5M2: return "e5m2";
    case MxElement::E2M1: return "e2m1";
  }
  return "invalid";
}

// The largest finite magnitude of the element format.
MEGATRON_HD float mx_element_max(MxElement element) {
  return element == MxElement::E4M3 ? 448.0f : element == MxElement::E5M2 ? 57344.0f : 6.0f;
}

// float(1 / max_elem), rounded once from double as TE's max_norm_rcp is. Not exact (1/7 and 1/3 are not
// dyadic): the scale rule multiplies by this constant in fp32, as TE does, rather than divide.
MEGATRON_HD float mx_max_reciprocal(MxElement element) {
  return element == MxElement::E4M3 ? float(1.0 / 448.0) : element == MxElement::E5M2 ? float(1.0 / 57344.0)
                                                                                      : float(1.0 / 6.0);
}

// ---- E8M0 ----

// The E8M0 code of the smallest power of two >= v, for v >= 0 (-0 counts as 0): 0 for v <= 2^-127, 254 for
// v > 2^126 (the largest finite scale; +inf too), 255 for NaN.
MEGATRON_HD uint8_t e8m0_round_up(float v) {
  const uint32_t a = detail::float_bits(v) & 0x7fffffffu;
  if (a > 0x7f800000u) return 255;
  if (a == 0x7f800000u) return 254;
  const uint32_t exp = a >> 23, mant = a & 0x7fffffu;
  // fp32 subnormals are mant * 2^-149: at most 2^-127 (code 0) when mant <= 2^22, else below 2^-126 (code 1).
  if (exp == 0) return mant <= 0x400000u ? 0 : 1;
  // A normal v = 1.mant * 2^(exp - 127) is a power of two iff mant == 0; otherwise round up one binade,
  // except from the top binade (2^128 would be code 255, NaN).
  return uint8_t(mant != 0 && exp < 254 ? exp + 1 : exp);
}

// 2^(code - 127) as fp32 (code 0: the subnormal 2^-127), NaN for code 255.
MEGATRON_HD float e8m0_to_float(uint8_t code) {
  if (code == 255) return detail::bits_float(0x7fffffffu);
  if (code == 0) return detail::bits_float(0x00400000u);
  return detail::bits_float(uint32_t(code) << 23);
}

// 2^(127 - code) as fp32: the factor that scales a block's inputs to its elements (code 254: the subnormal
// 2^-127), NaN for code 255.
MEGATRON_HD float e8m0_reciprocal(uint8_t code) {
  if (code == 255) return detail::bits_float(0x7fffffffu);
  if (code == 254) return detail::bits_float(0x00400000u);
  return detail::bits_float(uint32_t(254 - code) << 23);
}

// ---- E2M1 ----

// Round to nearest, ties to the even code (mantissa bit 0), saturating to +-6; the sign survives on zeros;
// NaN -> +6 (0x7). The thresholds are the midpoints between neighbours, each tie going to the even side.
MEGATRON_HD uint8_t e2m1_from_float(float v) {
  const uint32_t u = detail::float_bits(v);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7;
  const float m = detail::bits_float(a);
  const uint8_t mag = m <= 0.25f ? 0 : m < 0.75f ? 1 : m <= 1.25f ? 2 : m < 1.75f ? 3
                    : m <= 2.5f  ? 4 : m < 3.5f  ? 5 : m <= 5.0f  ? 6 : 7;
  return uint8_t(((u >> 28) & 0x8u) | mag);
}

// The value of the E2M1 code in the low 4 bits of `code` (the high bits are ignored).
MEGATRON_HD float e2m1_to_float(uint8_t code) {
  const uint32_t exp = (code >> 1) & 0x3u, mant = code & 0x1u;
  // exponent field 0: mant * 0.5; else (1 + mant / 2) * 2^(exp - 1)
  const float mag = exp == 0 ? 0.5f * float(mant) : (1.0f + 0.5f * float(mant)) * float(1u << (exp - 1));
  return (code & 0x8u) ? -mag : mag;
}

// ---- blocks ----

// The E8M0 scale code of a block whose largest |element| (NaNs skipped) is `amax`.
MEGATRON_HD uint8_t mx_scale_code(float amax, MxElement element) {
  return e8m0_round_up(amax * mx_max_reciprocal(element));
}

// The element code of an already scaled value (E2M1: in the low 4 bits).
MEGATRON_HD uint8_t mx_encode(float scaled, MxElement element) {
  if (element == MxElement::E4M3) return fp8e4m3_from_float(scaled).bits;
  if (element == MxElement::E5M2) return fp8e5m2_from_float(scaled).bits;
  return e2m1_from_float(scaled);
}

// The value of an element code, before its block scale.
MEGATRON_HD float mx_decode(uint8_t code, MxElement element) {
  if (element == MxElement::E4M3) return to_float(fp8e4m3_t{code});
  if (element == MxElement::E5M2) return to_float(fp8e5m2_t{code});
  return e2m1_to_float(code);
}

}  // namespace megatron::ops
