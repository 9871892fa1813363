#include "megatron/core/dtype.h"

namespace megatron {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: case DType::U16: return 2;
    case DType::F8E4M3: case DType::F8E5M2: case DType::I8: case DType::U8: return 1;
  }
  MEGATRON_FAIL("dtype_size: invalid dtype code ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::U16: return "u16";
  }
  return "<invalid dtype>";
}

DType parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) return t;
  MEGATRON_FAIL("unknown dtype '", name, "' (expected one of f32 f64 f16 bf16 f8e4m3 f8e5m2 i8 i16 i32 i64 u8 u16)");
}

bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16 || is_fp8(t);
}
bool is_fp8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }

}  // namespace megatron
