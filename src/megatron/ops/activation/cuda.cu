// CUDA activations: grid-stride elementwise kernels with 16-byte vectors when every pointer is 16-byte
// aligned (and, for SwiGLU, F is a multiple of the vector width so a vector never straddles the gate/up
// boundary); otherwise one element per step. fp32 math, one rounding per output.
#include "megatron/ops/activation/cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/activation/swiglu_math.cuh"
#include "megatron/ops/cuda_common.cuh"

namespace megatron::ops::cuda {
namespace {


constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

struct GeluFwd {
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
  }
};
struct GeluBwd {
  __device__ float operator()(float dy, float x) const {
    const float t = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
    return dy * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluCoeff * x * x));
  }
};
struct SiluFwd {
  __device__ float operator()(float x) const { return x * sigmoidf(x); }
};
struct SiluBwd {
  __device__ float operator()(float dy, float x) const {
    const float s = sigmoidf(x);
    return dy * s * (1.f + x * (1.f - s));
  }
};

constexpr int kThreads = 256;

// y = f(x) over n elements: VEC-wide steps for the first n / VEC * VEC, then the tail one by one.
template <class T, int VEC, class F>
__global__ void __launch_bounds__(kThreads) unary_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, nv = n / VEC;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < nv; v += stride) {
    float a[VEC];
    load_vec<VEC>(x + v * VEC, a);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = f(a[i]);
    store_vec<VEC>(y + v * VEC, a);
  }
  for (int64_t i = nv * VEC + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = from_f32<T>(f(to_f32(x[i])));
}

// dx = f(dy, x).
template <class T, int VEC, class F>
__global__ void __launch_bounds__(kThreads)
    binary_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, nv = n / VEC;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < nv; v += stride) {
    float a[VEC], g[VEC];
    load_vec<VEC>(x + v * VEC, a);
    load_vec<VEC>(dy + v * VEC, g);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = f(g[i], a[i]);
    store_vec<VEC>(dx + v * VEC, a);
  }
  for (int64_t i = nv * VEC + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = from_f32<T>(f(to_f32(dy[i]), to_f32(x[i])));
}

// SwiGLU over rows of x [rows, 2F]; VEC divides F. Step v covers y[r, c..c+VEC) with r = v / (F/VEC).
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    swiglu_fwd_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t rows, int64_t f) {
  const int64_t fv = f / VEC, total = rows * fv, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t r = v / fv, c = (v - r * fv) * VEC;
    float gate[VEC], up[VEC];
    load_vec<VEC>(x + r * 2 * f + c, gate);
    load_vec<VEC>(x + r * 2 * f + f + c, up);
#pragma unroll
    for (int i = 0; i < VEC; ++i) gate[i] = swiglu_value(gate[i], up[i]);
    store_vec<VEC>(y + r * f + c, gate);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) swiglu_bwd_kernel(T* __restrict__ dx, const T* __restrict__ dy,
                                                              const T* __restrict__ x, int64_t rows, int64_t f) {
  const int64_t fv = f / VEC, total = rows * fv, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t r = v / fv, c = (v - r * fv) * VEC;
    float gate[VEC], up[VEC], g[VEC], dgate[VEC], dup[VEC];
    load_vec<VEC>(x + r * 2 * f + c, gate);
    load_vec<VEC>(x + r * 2 * f + f + c, up);
    load_vec<VEC>(dy + r * f + c, g);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      dgate[i] = swiglu_grad_gate(g[i], gate[i], up[i]);
      dup[i] = swiglu_grad_up(g[i], gate[i]);
    }
    store_vec<VEC>(dx + r * 2 * f + c, dgate);
    store_vec<VEC>(dx + r * 2 * f + f + c, dup);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned grid_for(int64_t work) {
  const int64_t blocks = (std::max<int64_t>(work, 1) + kThreads - 1) / kThreads;
  return unsigned(std::min<int64_t>(blocks, int64_t(1) << 30));
}

// Calls fn.template operator()<T>() with the native CUDA type for `dtype`.
template <class Fn>
void dispatch(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::BF16: return fn.template operator()<__nv_bfloat16>();
    case DType::F16: return fn.template operator()<__half>();
    default: MEGATRON_FAIL(op, " (cuda): unsupported dtype ", dtype_name(dtype));
  }
}

template <class T, class F>
void launch_unary(cudaStream_t stream, const char* name, const Tensor& y, const Tensor& x, F f) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n = x.numel();
  if (n == 0) return;
  T* py = static_cast<T*>(y.data_ptr());
  const T* px = static_cast<const T*>(x.data_ptr());
  if (aligned16(py) && aligned16(px)) unary_kernel<T, kVec><<<grid_for(n / kVec + 1), kThreads, 0, stream>>>(py, px, n, f);
  else unary_kernel<T, 1><<<grid_for(n), kThreads, 0, stream>>>(py, px, n, f);
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching ", name, " (", x.describe(), ")");
}

template <class T, class F>
void launch_binary(cudaStream_t stream, const char* name, const Tensor& dx, const Tensor& dy, const Tensor& x, F f) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n = x.numel();
  if (n == 0) return;
  T* pdx = static_cast<T*>(dx.data_ptr());
  const T* pdy = static_cast<const T*>(dy.data_ptr());
  const T* px = static_cast<const T*>(x.data_ptr());
  if (aligned16(pdx) && aligned16(pdy) && aligned16(px))
    binary_kernel<T, kVec><<<grid_for(n / kVec + 1), kThreads, 0, stream>>>(pdx, pdy, px, n, f);
  else binary_kernel<T, 1><<<grid_for(n), kThreads, 0, stream>>>(pdx, pdy, px, n, f);
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching ", name, " (", x.describe(), ")");
}

}  // namespace

void pointwise_forward(Context& ctx, Pointwise op, const Tensor& y, const Tensor& x) {
  cudaStream_t stream = ctx.stream();
  dispatch(x.dtype(), "activation forward", [&]<class T>() {
    if (op == Pointwise::Gelu) launch_unary<T>(stream, "gelu_forward", y, x, GeluFwd{});
    else launch_unary<T>(stream, "silu_forward", y, x, SiluFwd{});
  });
}

void pointwise_backward(Context& ctx, Pointwise op, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  cudaStream_t stream = ctx.stream();
  dispatch(x.dtype(), "activation backward", [&]<class T>() {
    if (op == Pointwise::Gelu) launch_binary<T>(stream, "gelu_backward", dx, dy, x, GeluBwd{});
    else launch_binary<T>(stream, "silu_backward", dx, dy, x, SiluBwd{});
  });
}

void swiglu_forward(Context& ctx, const Tensor& y, const Tensor& x) {
  cudaStream_t stream = ctx.stream();
  const int64_t rows = x.shape().rows(), f = x.shape().cols() / 2;
  if (rows * f == 0) return;
  dispatch(x.dtype(), "swiglu_forward", [&]<class T>() {
    constexpr int kVec = 16 / sizeof(T);
    T* py = static_cast<T*>(y.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    if (f % kVec == 0 && aligned16(py) && aligned16(px))
      swiglu_fwd_kernel<T, kVec><<<grid_for(rows * (f / kVec)), kThreads, 0, stream>>>(py, px, rows, f);
    else swiglu_fwd_kernel<T, 1><<<grid_for(rows * f), kThreads, 0, stream>>>(py, px, rows, f);
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching swiglu_fwd_kernel (", x.describe(), ")");
  });
}

void swiglu_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  cudaStream_t stream = ctx.stream();
  const int64_t rows = x.shape().rows(), f = x.shape().cols() / 2;
  if (rows * f == 0) return;
  dispatch(x.dtype(), "swiglu_backward", [&]<class T>() {
    constexpr int kVec = 16 / sizeof(T);
    T* pdx = static_cast<T*>(dx.data_ptr());
    const T* pdy = static_cast<const T*>(dy.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    if (f % kVec == 0 && aligned16(pdx) && aligned16(pdy) && aligned16(px))
      swiglu_bwd_kernel<T, kVec><<<grid_for(rows * (f / kVec)), kThreads, 0, stream>>>(pdx, pdy, px, rows, f);
    else swiglu_bwd_kernel<T, 1><<<grid_for(rows * f), kThreads, 0, stream>>>(pdx, pdy, px, rows, f);
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching swiglu_bwd_kernel (", x.describe(), ")");
  });
}

}  // namespace megatron::ops::cuda
