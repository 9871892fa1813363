// Scalar rules shared by the CPU reference and the CUDA kernels of the fp8 family (see fp8.h), so that both
// compute the very same bits: the amax key, the NaN-propagating max of a history column, and the scale
// from an amax.
#pragma once

#include <cfloat>
#include <cstdint>

#include "megatron/core/float_types.h"

namespace megatron::ops::fp8_detail {

// The formats' largest finite values.
inline constexpr float kE4M3Max = 448.0f, kE5M2Max = 57344.0f;

// The NaN every NaN input counts as in an amax: the largest positive int32, so it wins every max.
inline constexpr int32_t kNanKey = 0x7fffffff;

// |v| as an int32 key: for non-negative floats the integer order of the bits is the numeric order; NaN of
// any sign or payload becomes kNanKey.
MEGATRON_HD int32_t amax_key(float v) {
  uint32_t a = detail::float_bits(v) & 0x7fffffffu;
  return a > 0x7f800000u ? kNanKey : int32_t(a);
}

// max(m, v) where a NaN on either side gives NaN (torch.max's rule). Which NaN comes out may depend on the
// order, but a NaN amax only ever selects "keep the scale", so no output bit depends on it.
MEGATRON_HD float max_propagating_nan(float m, float v) { return (v > m || v != v) ? v : m; }

// fp8_scale_from_amax's rule for one element: (fp8_max / amax) / 2^margin in fp32 (pow2_margin = 2^margin,
// a normal fp32), `previous` or 1 when amax is not a positive finite number, FLT_MAX on overflow.
MEGATRON_HD float scale_from_amax(float amax, float previous, float fp8_max, float pow2_margin, bool keep_on_invalid) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return keep_on_invalid ? previous : 1.0f;  // 0, inf, NaN
#if defined(__CUDA_ARCH__)
  float s = __fdiv_rn(__fdiv_rn(fp8_max, amax), pow2_margin);
#else
  float s = (fp8_max / amax) / pow2_margin;
#endif
  return s > FLT_MAX ? FLT_MAX : s;
}

// 1 / scale, correctly rounded on both sides (the intrinsics keep that under any nvcc flags).
MEGATRON_HD float reciprocal(float scale) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, scale);
#else
  return 1.0f / scale;
#endif
}

// FP8 block scaling's scale for one block (ops/fp8_block/fp8_block.h): fp8_max / amax in fp32, 1 when amax
// is not a positive finite number, FLT_MAX on overflow, then rounded down to a power of two by clearing the
// mantissa bits (Transformer Engine's power_2_scale). The result is a normal fp32 2^e with e in [-120, 127].
MEGATRON_HD float block_scale_from_amax(float amax, float fp8_max) {
  const float s = scale_from_amax(amax, 1.0f, fp8_max, 1.0f, /*keep_on_invalid=*/false);
  return detail::bits_float(detail::float_bits(s) & 0xff800000u);
}

// 1 / p for a normal power of two p = 2^e, exactly, without a division: 2^-e (a subnormal for e = 127).
MEGATRON_HD float pow2_reciprocal(float p) {
  const int e = int((detail::float_bits(p) >> 23) & 0xffu) - 127;
  const int r = -e;
  return r >= -126 ? detail::bits_float(uint32_t(r + 127) << 23) : detail::bits_float(1u << (r + 149));
}

}  // namespace megatron::ops::fp8_detail
