// Scalar rules shared by the CPU reference and the CUDA kernels of the elementwise family, so that both
// compute the very same bits: float -> integer conversion and the amax key.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "megatron/core/float_types.h"

namespace megatron::ops::elementwise_detail {

// Toward zero, saturated to T's range, NaN -> 0 (what cvt.rzi.sat does, made explicit for every width).
template <class T>
MEGATRON_HD T saturating_int(double v) {
  static_assert(std::is_integral_v<T>);
  if (!(v == v)) return T(0);
  constexpr double lo = double(std::numeric_limits<T>::min());
  constexpr double hi = double(std::numeric_limits<T>::max());  // 2^63 for int64 (rounded up): v >= hi saturates
  if (v >= hi) return std::numeric_limits<T>::max();
  if (v <= lo) return std::numeric_limits<T>::min();
  return T(v);
}

// amax works on the bit patterns of |x| as fp32: for non-negative floats the unsigned order of the bits is
// the numeric order, and every NaN sorts above +inf, so max is exact, order-independent and NaN-propagating.
MEGATRON_HD uint32_t abs_key(float v) { return detail::float_bits(v) & 0x7fffffffu; }

}  // namespace megatron::ops::elementwise_detail
