// Element types of tensors. F64 exists for the CPU reference kernels and finite-difference checks;
// the GPU kernels work on F32 and the narrow float types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "megatron/core/error.h"
#include "megatron/core/float_types.h"

namespace megatron {

enum class DType : uint8_t { F32, F64, F16, BF16, F8E4M3, F8E5M2, I8, I16, I32, I64, U8, U16 };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2,
                                       DType::I8,  DType::I16, DType::I32, DType::I64,  DType::U8,     DType::U16};

size_t dtype_size(DType t);
const char* dtype_name(DType t);                    // "f32", "bf16", "f8e4m3", ...
DType parse_dtype(std::string_view name);           // inverse of dtype_name; throws on unknown names
bool is_floating(DType t);
bool is_fp8(DType t);
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<fp16_t> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<bf16_t> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<fp8e4m3_t> { static constexpr DType value = DType::F8E4M3; };
template <> struct dtype_of<fp8e5m2_t> { static constexpr DType value = DType::F8E5M2; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::I8; };
template <> struct dtype_of<int16_t> { static constexpr DType value = DType::I16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::U16; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// Calls fn.template operator()<T>() with the C++ storage type of `t`:
//   visit_dtype(t, [&]<class T>() { ... });
template <class Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn.template operator()<float>();
    case DType::F64: return fn.template operator()<double>();
    case DType::F16: return fn.template operator()<fp16_t>();
    case DType::BF16: return fn.template operator()<bf16_t>();
    case DType::F8E4M3: return fn.template operator()<fp8e4m3_t>();
    case DType::F8E5M2: return fn.template operator()<fp8e5m2_t>();
    case DType::I8: return fn.template operator()<int8_t>();
    case DType::I16: return fn.template operator()<int16_t>();
    case DType::I32: return fn.template operator()<int32_t>();
    case DType::I64: return fn.template operator()<int64_t>();
    case DType::U8: return fn.template operator()<uint8_t>();
    case DType::U16: return fn.template operator()<uint16_t>();
  }
  MEGATRON_FAIL("visit_dtype: invalid dtype code ", int(t));
}

// Same, restricted to floating types (F32, F64, F16, BF16, F8*); `op` names the caller in the error.
template <class Fn>
decltype(auto) visit_float_dtype(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn.template operator()<float>();
    case DType::F64: return fn.template operator()<double>();
    case DType::F16: return fn.template operator()<fp16_t>();
    case DType::BF16: return fn.template operator()<bf16_t>();
    case DType::F8E4M3: return fn.template operator()<fp8e4m3_t>();
    case DType::F8E5M2: return fn.template operator()<fp8e5m2_t>();
    default: break;
  }
  MEGATRON_FAIL(op, ": dtype ", dtype_name(t), " is not a floating type");
}

// Widening to double / narrowing from double for any storage type (CPU reference code).
template <class T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_integral_v<T>) return double(v);
  else return double(to_float(v));
}
template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_integral_v<T>) return T(v);
  else return from_float<T>(float(v));
}

}  // namespace megatron
