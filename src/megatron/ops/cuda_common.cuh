// Device helpers shared by the op families' CUDA kernels: element conversions to and from fp32 for every
// 16/32-bit float storage type (ours and CUDA's native ones, which share a layout), the storage -> native
// type map, and aligned vector loads/stores. Include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "megatron/core/dtype.h"

namespace megatron::ops::cuda {

// Our storage structs -> CUDA's native types (same layout), so kernels can use the intrinsics.
template <class S> struct Native { using type = S; };
template <> struct Native<bf16_t> { using type = __nv_bfloat16; };
template <> struct Native<fp16_t> { using type = __half; };
template <class S> using native_t = typename Native<S>::type;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(bf16_t v) { return __uint_as_float(uint32_t(v.bits) << 16); }
__device__ __forceinline__ float to_f32(fp16_t v) { return __half2float(__ushort_as_half(v.bits)); }

// Round to nearest even, as core/float_types.h does on the host.
template <class T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) {
  return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(v))};
}
template <> __device__ __forceinline__ fp16_t from_f32<fp16_t>(float v) {
  return fp16_t{__half_as_ushort(__float2half_rn(v))};
}

// N consecutive elements moved as one aligned access (N * sizeof(T) of 4, 8 or 16 bytes).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Loads N elements at p (aligned to N * sizeof(T)) widened to fp32.
template <int N, class T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
  Vec<T, N> v = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_f32(v.v[i]);
}

// Rounds N fp32 values to T and stores them at p (aligned to N * sizeof(T)).
template <int N, class T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
  Vec<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

}  // namespace megatron::ops::cuda
