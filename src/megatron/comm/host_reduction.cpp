#include "megatron/comm/host_reduction.h"

#include <type_traits>

namespace megatron::comm {
namespace {

template <class T>
T combine(T a, T b, bool max) {
  if constexpr (std::is_integral_v<T>) {
    if (max) return a > b ? a : b;
    using U = std::make_unsigned_t<T>;
    return T(U(U(a) + U(b)));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (max) return (a != a || b != b) ? (a != a ? a : b) : (a > b ? a : b);
    return a + b;
  } else {  // bf16, f16: through f32, rounded back
    return from_float<T>(combine(to_float(a), to_float(b), max));
  }
}

}  // namespace

bool host_reducible(DType dtype) { return dtype != DType::F8E4M3 && dtype != DType::F8E5M2; }

void reduce_into(DType dtype, ReduceOp op, void* acc, const void* in, int64_t count) {
  MEGATRON_CHECK(host_reducible(dtype), "cannot reduce ", dtype_name(dtype), " values (no such reduction in MPI)");
  const bool max = op == ReduceOp::Max;
  visit_dtype(dtype, [&]<class T>() {
    if constexpr (std::is_same_v<T, fp8e4m3_t> || std::is_same_v<T, fp8e5m2_t>) {
      return;
    } else {
      T* a = static_cast<T*>(acc);
      const T* b = static_cast<const T*>(in);
      for (int64_t i = 0; i < count; ++i) a[i] = combine(a[i], b[i], max);
    }
  });
}

void divide_by_size(DType dtype, void* data, int64_t count, int divisor) {
  visit_dtype(dtype, [&]<class T>() {
    T* p = static_cast<T*>(data);
    for (int64_t i = 0; i < count; ++i) {
      if constexpr (std::is_integral_v<T>) p[i] = T(p[i] / divisor);
      else p[i] = from_double<T>(to_double(p[i]) / double(divisor));
    }
  });
}

}  // namespace megatron::comm
