// CUDA kernels of the elementwise family.
//
// Memory-bound by nature, so each kernel makes one pass over memory with 16-byte vector accesses (when
// every pointer is 16-byte aligned; a scalar variant handles the rest), grid-stride loops over at most one
// wave of blocks, fp32 math (fp64 for F64 tensors). Reductions use fixed trees and no float atomics, so
// results do not change from run to run; amax uses an integer atomicMax on |x|'s bits, which is exact.
#include "megatron/ops/elementwise/cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "megatron/core/cuda_check.h"
#include "megatron/core/philox.h"
#include "megatron/ops/elementwise/scalar.h"
#include "megatron/runtime/cuda_libraries.h"

namespace megatron::ops::cuda {

namespace {

using elementwise_detail::abs_key;
using elementwise_detail::saturating_int;

constexpr int kThreads = 256;

// ---------------------------------------------------------------- element conversions

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(bf16_t v) { return __uint_as_float(uint32_t(v.bits) << 16); }
__device__ __forceinline__ float widen(fp16_t v) {
  __half_raw r;
  r.x = v.bits;
  return __half2float(__half(r));
}
__device__ __forceinline__ float widen(fp8e4m3_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.bits, __NV_E4M3)));
}
__device__ __forceinline__ float widen(fp8e5m2_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.bits, __NV_E5M2)));
}

template <class T>
__device__ __forceinline__ T narrow(float f) {
  if constexpr (std::is_same_v<T, float>) return f;
  else if constexpr (std::is_same_v<T, bf16_t>) return bf16_t{__nv_bfloat16_raw(__float2bfloat16_rn(f)).x};
  else if constexpr (std::is_same_v<T, fp16_t>) return fp16_t{__half_raw(__float2half_rn(f)).x};
  else if constexpr (std::is_same_v<T, fp8e4m3_t>) return fp8e4m3_t{__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)};
  else return fp8e5m2_t{__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2)};
}

// Compute type: fp64 for F64 tensors, fp32 for everything else.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__device__ __forceinline__ acc_t<T> load_acc(T v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return widen(v);
}
template <class T>
__device__ __forceinline__ T store_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return narrow<T>(v);
}

// One element of a cast; the same rules as the host conversions (tests/core/test_float_types_cuda.cu
// checks the intrinsics against them bit for bit).
template <class TOut, class TIn>
__device__ __forceinline__ TOut convert(TIn v) {
  if constexpr (std::is_integral_v<TIn>) {
    return float(v);  // TOut is float: cvt.rn.f32.sN
  } else if constexpr (std::is_integral_v<TOut>) {
    return saturating_int<TOut>(double(v));  // TIn is float
  } else if constexpr (std::is_same_v<TIn, double>) {
    if constexpr (std::is_same_v<TOut, double>) return v;
    else return narrow<TOut>(__double2float_rn(v));
  } else {
    float f = widen(v);
    if constexpr (std::is_same_v<TOut, double>) return double(f);
    else return narrow<TOut>(f);
  }
}

// ---------------------------------------------------------------- vector access

template <class T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Vec {
  T v[N];
};

// Loads / stores N elements at p[g*N] as 16-byte transactions (p 16-byte aligned, sizeof(Vec) % 16 == 0).
template <class T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p, int64_t g) {
  static_assert(sizeof(Vec<T, N>) % 16 == 0);
  Vec<T, N> r;
  const uint4* src = reinterpret_cast<const uint4*>(p + g * N);
  uint4* dst = reinterpret_cast<uint4*>(&r);
#pragma unroll
  for (int c = 0; c < int(sizeof(r) / 16); ++c) dst[c] = src[c];
  return r;
}
template <class T, int N>
__device__ __forceinline__ void store_vec(T* p, int64_t g, const Vec<T, N>& v) {
  static_assert(sizeof(Vec<T, N>) % 16 == 0);
  uint4* dst = reinterpret_cast<uint4*>(p + g * N);
  const uint4* src = reinterpret_cast<const uint4*>(&v);
#pragma unroll
  for (int c = 0; c < int(sizeof(v) / 16); ++c) dst[c] = src[c];
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }

int sm_count(Context& ctx) { return ctx.cuda_libraries().properties.multiProcessorCount; }

// Enough blocks for `items` threads' worth of work, capped at one full wave (grid-stride loops do the rest).
unsigned grid_for(Context& ctx, int64_t items, int threads = kThreads) {
  int64_t blocks = (items + threads - 1) / threads;
  int64_t cap = int64_t(sm_count(ctx)) * (2048 / threads);
  return unsigned(std::clamp<int64_t>(blocks, 1, cap));
}

cudaStream_t stream_of(Context& ctx) { return ctx.stream(); }

// ---------------------------------------------------------------- reductions within a block

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, 1D); the result is valid in thread 0.
template <class A>
__device__ A block_sum(A v) {
  __shared__ A partial[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  A r = A(0);
  if (warp == 0) {
    r = lane < int(blockDim.x >> 5) ? partial[lane] : A(0);
    r = warp_sum(r);
  }
  return r;
}

// Max over the block of a key; thread 0 then folds it into *target with one atomicMax.
__device__ void block_max_to(uint32_t key, unsigned int* target) {
  __shared__ uint32_t partial[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  key = __reduce_max_sync(0xffffffffu, key);
  if (lane == 0) partial[warp] = key;
  __syncthreads();
  if (warp == 0) {
    uint32_t k = lane < int(blockDim.x >> 5) ? partial[lane] : 0u;
    k = __reduce_max_sync(0xffffffffu, k);
    if (lane == 0 && k != 0u) atomicMax(target, k);
  }
}

// ---------------------------------------------------------------- cast

template <class TOut, class TIn, int VEC>
__global__ void cast_kernel(TOut* out, const TIn* in, int64_t n) {
  const int64_t tid = global_thread(), stride = grid_threads();
  if constexpr (VEC > 1) {
    const int64_t groups = n / VEC;
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<TIn, VEC> a = load_vec<TIn, VEC>(in, g);
      Vec<TOut, VEC> b;
#pragma unroll
      for (int k = 0; k < VEC; ++k) b.v[k] = convert<TOut>(a.v[k]);
      store_vec<TOut, VEC>(out, g, b);
    }
    for (int64_t i = groups * VEC + tid; i < n; i += stride) out[i] = convert<TOut>(in[i]);
  } else {
    for (int64_t i = tid; i < n; i += stride) out[i] = convert<TOut>(in[i]);
  }
}

// Elements per thread so that the narrower side moves 16 bytes.
template <class A, class B>
constexpr int vec_width() {
  return int(16 / std::min(sizeof(A), sizeof(B)));
}

template <class TOut, class TIn>
void launch_cast(Context& ctx, const Tensor& out, const Tensor& in) {
  constexpr int V = vec_width<TIn, TOut>();
  const int64_t n = in.numel();
  auto* y = static_cast<TOut*>(out.data_ptr());
  const auto* x = static_cast<const TIn*>(in.data_ptr());
  if (aligned16(x) && aligned16(y)) {
    cast_kernel<TOut, TIn, V><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(y, x, n);
  } else {
    cast_kernel<TOut, TIn, 1><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(y, x, n);
  }
  CUDA_CHECK_LAUNCH(str_cat("cast_kernel (", in.describe(), " -> ", out.describe(), ")"));
}

// ---------------------------------------------------------------- cast_scaled

template <class TOut, class TIn>
__device__ __forceinline__ TOut scaled_element(TIn v, float scale, uint32_t& key) {
  if constexpr (std::is_same_v<TIn, double>) {
    key = max(key, abs_key(__double2float_rn(v)));
    double p = __dmul_rn(v, double(scale));
    if constexpr (std::is_same_v<TOut, double>) return p;
    else return narrow<TOut>(__double2float_rn(p));
  } else {
    float f = widen(v);
    key = max(key, abs_key(f));
    float p = __fmul_rn(f, scale);
    if constexpr (std::is_same_v<TOut, double>) return double(p);
    else return narrow<TOut>(p);
  }
}

template <class TOut, class TIn, int VEC>
__global__ void cast_scaled_kernel(TOut* out, const TIn* in, int64_t n, float scale, unsigned int* amax) {
  const int64_t tid = global_thread(), stride = grid_threads();
  uint32_t key = 0;
  int64_t done = 0;
  if constexpr (VEC > 1) {
    const int64_t groups = n / VEC;
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<TIn, VEC> a = load_vec<TIn, VEC>(in, g);
      Vec<TOut, VEC> b;
#pragma unroll
      for (int k = 0; k < VEC; ++k) b.v[k] = scaled_element<TOut>(a.v[k], scale, key);
      store_vec<TOut, VEC>(out, g, b);
    }
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride) out[i] = scaled_element<TOut>(in[i], scale, key);
  block_max_to(key, amax);
}

template <class TOut, class TIn>
void launch_cast_scaled(Context& ctx, const Tensor& out, const Tensor& amax, const Tensor& in, float scale) {
  constexpr int V = vec_width<TIn, TOut>();
  const int64_t n = in.numel();
  auto* y = static_cast<TOut*>(out.data_ptr());
  const auto* x = static_cast<const TIn*>(in.data_ptr());
  auto* m = static_cast<unsigned int*>(amax.data_ptr());
  CUDA_CHECK(cudaMemsetAsync(m, 0, sizeof(float), stream_of(ctx)));
  if (n == 0) return;
  if (aligned16(x) && aligned16(y)) {
    cast_scaled_kernel<TOut, TIn, V><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(y, x, n, scale, m);
  } else {
    cast_scaled_kernel<TOut, TIn, 1><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(y, x, n, scale, m);
  }
  CUDA_CHECK_LAUNCH(str_cat("cast_scaled_kernel (", in.describe(), " -> ", out.describe(), ")"));
}

// ---------------------------------------------------------------- fills

template <class U, int VEC>
__global__ void fill_kernel(U* out, int64_t n, U value) {
  const int64_t tid = global_thread(), stride = grid_threads();
  int64_t done = 0;
  if constexpr (VEC > 1) {
    Vec<U, VEC> v;
#pragma unroll
    for (int k = 0; k < VEC; ++k) v.v[k] = value;
    const int64_t groups = n / VEC;
    for (int64_t g = tid; g < groups; g += stride) store_vec<U, VEC>(out, g, v);
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride) out[i] = value;
}

template <class U>
void launch_fill(Context& ctx, void* data, int64_t n, const void* value_bytes) {
  U value;
  std::memcpy(&value, value_bytes, sizeof(U));
  auto* y = static_cast<U*>(data);
  constexpr int V = int(16 / sizeof(U));
  if (aligned16(y)) fill_kernel<U, V><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(y, n, value);
  else fill_kernel<U, 1><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(y, n, value);
  CUDA_CHECK_LAUNCH(str_cat("fill_kernel (", n, " elements of ", sizeof(U), " bytes)"));
}

// The fp32 (fp64 for F64) affine map of a random number, rounded once to T. Explicit _rn intrinsics keep
// the compiler from contracting to an FMA, so the CPU reference gives the same bits.
template <class T>
__device__ __forceinline__ T affine(acc_t<T> a, acc_t<T> b, float z) {
  if constexpr (std::is_same_v<T, double>) return __dadd_rn(a, __dmul_rn(b, double(z)));
  else return narrow<T>(__fadd_rn(a, __fmul_rn(b, z)));
}

// VEC elements per thread; with kBlocks the group starts on a Philox block (index_base % 4 == 0), so one
// Philox call serves four elements. Otherwise every element calls philox_uniform.
template <class T, int VEC, bool kBlocks>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, uint64_t base, acc_t<T> lo,
                                    acc_t<T> range) {
  const int64_t tid = global_thread(), stride = grid_threads();
  int64_t done = 0;
  if constexpr (kBlocks) {
    static_assert(VEC % 4 == 0);
    const int64_t groups = n / VEC;
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<T, VEC> v;
#pragma unroll
      for (int q = 0; q < VEC / 4; ++q) {
        uint64_t block = (base + uint64_t(g * VEC + q * 4)) >> 2;
        Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32),
                                     uint32_t(seed), uint32_t(seed >> 32));
#pragma unroll
        for (int k = 0; k < 4; ++k)  // philox_uniform's formula on word k of the block
          v.v[q * 4 + k] = affine<T>(lo, range, float(r.v[k] >> 8) * (1.0f / 16777216.0f));
      }
      store_vec<T, VEC>(out, g, v);
    }
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride)
    out[i] = affine<T>(lo, range, philox_uniform(seed, offset, base + uint64_t(i)));
}

// philox_normal (core/philox.h) for both elements of Philox block `block`: the even one takes the cosine,
// the odd one the sine of the same (radius, angle); sincos shares the argument reduction.
__device__ __forceinline__ void philox_normal_pair(uint64_t seed, uint64_t offset, uint64_t block, float& even,
                                                   float& odd) {
  Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32),
                               uint32_t(seed), uint32_t(seed >> 32));
  double u1 = (double((uint64_t(r.v[0]) << 21) ^ r.v[1]) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = double((uint64_t(r.v[2]) << 21) ^ r.v[3]) * (1.0 / 9007199254740992.0);
  u1 = u1 > 1.0 ? 1.0 : u1;
  double radius = sqrt(-2.0 * log(u1));
  double angle = 6.283185307179586 * u2;
  double s, c;
  sincos(angle, &s, &c);
  even = float(radius * c);
  odd = float(radius * s);
}

// With kPairs the group starts on an even global index (index_base even), so pairs share one Box-Muller.
template <class T, int VEC, bool kPairs>
__global__ void fill_normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, uint64_t base, acc_t<T> mean,
                                   acc_t<T> std) {
  const int64_t tid = global_thread(), stride = grid_threads();
  int64_t done = 0;
  if constexpr (kPairs) {
    static_assert(VEC % 2 == 0);
    const int64_t groups = n / VEC;
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<T, VEC> v;
#pragma unroll
      for (int q = 0; q < VEC / 2; ++q) {
        float z0, z1;
        philox_normal_pair(seed, offset, (base + uint64_t(g * VEC + q * 2)) >> 1, z0, z1);
        v.v[2 * q] = affine<T>(mean, std, z0);
        v.v[2 * q + 1] = affine<T>(mean, std, z1);
      }
      store_vec<T, VEC>(out, g, v);
    }
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride)
    out[i] = affine<T>(mean, std, philox_normal(seed, offset, base + uint64_t(i)));
}

// ---------------------------------------------------------------- transpose

constexpr int kTile = 32;
constexpr int kTileRows = 8;

// One 32x32 tile per iteration through shared memory (padded against bank conflicts); tiles of all
// batches are numbered linearly and visited grid-stride, so no grid dimension limit applies.
template <class U>
__global__ void transpose_kernel(U* out, const U* in, int64_t batch, int64_t m, int64_t n) {
  __shared__ U tile[kTile][kTile + 1];
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;
  const int64_t total = batch * tiles_m * tiles_n;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t b = t / (tiles_m * tiles_n);
    const int64_t rest = t % (tiles_m * tiles_n);
    const int64_t i0 = (rest / tiles_n) * kTile, j0 = (rest % tiles_n) * kTile;
    const U* src = in + b * m * n;
    U* dst = out + b * m * n;
#pragma unroll
    for (int k = 0; k < kTile; k += kTileRows) {
      int64_t i = i0 + ty + k, j = j0 + tx;
      if (i < m && j < n) tile[ty + k][tx] = src[i * n + j];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; k += kTileRows) {
      int64_t j = j0 + ty + k, i = i0 + tx;  // out[b][j][i] = in[b][i][j]
      if (j < n && i < m) dst[j * m + i] = tile[tx][ty + k];
    }
    __syncthreads();
  }
}

template <class U>
void launch_transpose(Context& ctx, const Tensor& out, const Tensor& in, int64_t batch, int64_t m, int64_t n) {
  int64_t tiles = batch * ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
  unsigned grid = unsigned(std::clamp<int64_t>(tiles, 1, int64_t(sm_count(ctx)) * 8));
  transpose_kernel<U><<<grid, dim3(kTile, kTileRows), 0, stream_of(ctx)>>>(
      static_cast<U*>(out.data_ptr()), static_cast<const U*>(in.data_ptr()), batch, m, n);
  CUDA_CHECK_LAUNCH(str_cat("transpose_kernel (", in.describe(), " -> ", out.describe(), ")"));
}

// ---------------------------------------------------------------- add / mul / scale / axpby

struct AddOp {
  static constexpr bool kUnary = false;
  template <class A>
  __device__ A operator()(A x, A y) const { return x + y; }
};
struct MulOp {
  static constexpr bool kUnary = false;
  template <class A>
  __device__ A operator()(A x, A y) const { return x * y; }
};
template <class A>
struct AxpbyOp {
  static constexpr bool kUnary = false;
  A alpha, beta;
  __device__ A operator()(A x, A y) const { return alpha * x + beta * y; }
};
template <class A>
struct ScaleOp {
  static constexpr bool kUnary = true;
  A alpha;
  __device__ A operator()(A x, A) const { return alpha * x; }
};

// out = op(a, b) elementwise; out may alias a or b (each thread reads its elements before writing them).
template <class T, int VEC, class Op>
__global__ void map2_kernel(T* out, const T* a, const T* b, int64_t n, Op op) {
  using A = acc_t<T>;
  const int64_t tid = global_thread(), stride = grid_threads();
  int64_t done = 0;
  if constexpr (VEC > 1) {
    const int64_t groups = n / VEC;
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<T, VEC> va = load_vec<T, VEC>(a, g), vb;
      if constexpr (!Op::kUnary) vb = load_vec<T, VEC>(b, g);
      Vec<T, VEC> r;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        r.v[k] = store_acc<T>(op(load_acc(va.v[k]), Op::kUnary ? A(0) : load_acc(vb.v[k])));
      store_vec<T, VEC>(out, g, r);
    }
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride)
    out[i] = store_acc<T>(op(load_acc(a[i]), Op::kUnary ? A(0) : load_acc(b[i])));
}

template <class T, class Op>
void launch_map2(Context& ctx, const char* name, const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  constexpr int V = int(16 / sizeof(T));
  const int64_t n = out.numel();
  auto* y = static_cast<T*>(out.data_ptr());
  const auto* pa = static_cast<const T*>(a.data_ptr());
  const auto* pb = static_cast<const T*>(b.data_ptr());
  if (aligned16(y) && aligned16(pa) && aligned16(pb))
    map2_kernel<T, V, Op><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(y, pa, pb, n, op);
  else
    map2_kernel<T, 1, Op><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(y, pa, pb, n, op);
  CUDA_CHECK_LAUNCH(str_cat(name, " kernel (", out.describe(), ")"));
}

// out[i] = in[i] * s[i / cols] in the accumulation type, rounded once; out may alias in.
template <class T, class S>
__global__ void scale_rows_kernel(T* out, const T* in, const S* s, int64_t n, int64_t cols) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = store_acc<T>(load_acc(in[i]) * A(s[i / cols]));
}

// Calls fn.template operator()<T>() for the arithmetic dtypes (F32, F16, BF16, F64).
template <class Fn>
void visit_arith(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn.template operator()<float>();
    case DType::F64: return fn.template operator()<double>();
    case DType::F16: return fn.template operator()<fp16_t>();
    case DType::BF16: return fn.template operator()<bf16_t>();
    default: MEGATRON_FAIL(op, ": dtype ", dtype_name(t), " is not supported on CUDA");
  }
}

// ---------------------------------------------------------------- reductions

// sum_rows: kWarps warps per row (1: a warp per row for short rows; 8: the whole block for long rows).
template <class T, int VEC, int kWarps>
__global__ void sum_rows_kernel(float* out, const T* in, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  constexpr int kPerRow = 32 * kWarps;
  constexpr int kRowsPerBlock = kThreads / kPerRow;
  __shared__ A partial[kThreads / 32];
  const int lane = threadIdx.x % kPerRow;
  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPerRow; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const T* x = in + row * cols;
    A s = A(0);
    if constexpr (VEC > 1) {
      const int64_t groups = cols / VEC;  // cols % VEC == 0 on this path
#pragma unroll 4
      for (int64_t g = lane; g < groups; g += kPerRow) {
        Vec<T, VEC> v = load_vec<T, VEC>(x, g);
#pragma unroll
        for (int k = 0; k < VEC; ++k) s += load_acc(v.v[k]);
      }
    } else {
      for (int64_t c = lane; c < cols; c += kPerRow) s += load_acc(x[c]);
    }
    s = warp_sum(s);
    if constexpr (kWarps > 1) {  // kRowsPerBlock == 1: the loop is uniform over the block
      if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
      __syncthreads();
      if (threadIdx.x == 0) {
        A t = A(0);
        for (int w = 0; w < kWarps; ++w) t += partial[w];
        out[row] = float(t);
      }
      __syncthreads();
    } else {
      if (lane == 0) out[row] = float(s);
    }
  }
}

template <class T>
void launch_sum_rows(Context& ctx, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  constexpr int V = int(16 / sizeof(T));
  const auto* x = static_cast<const T*>(in.data_ptr());
  float* y = out.data<float>();
  const bool vec = aligned16(x) && cols % V == 0;
  cudaStream_t s = stream_of(ctx);
  if (cols >= 4096) {
    unsigned grid = unsigned(std::clamp<int64_t>(rows, 1, int64_t(sm_count(ctx)) * 8));
    if (vec) sum_rows_kernel<T, V, 8><<<grid, kThreads, 0, s>>>(y, x, rows, cols);
    else sum_rows_kernel<T, 1, 8><<<grid, kThreads, 0, s>>>(y, x, rows, cols);
  } else {
    unsigned grid = unsigned(std::clamp<int64_t>((rows + 7) / 8, 1, int64_t(sm_count(ctx)) * 8));
    if (vec) sum_rows_kernel<T, V, 1><<<grid, kThreads, 0, s>>>(y, x, rows, cols);
    else sum_rows_kernel<T, 1, 1><<<grid, kThreads, 0, s>>>(y, x, rows, cols);
  }
  CUDA_CHECK_LAUNCH(str_cat("sum_rows_kernel (", in.describe(), ")"));
}

// sum_columns, pass 1: block (32, 8) owns 32*VEC columns and one split of the rows; each thread sums VEC
// adjacent columns over every 8th row of the split, then the 8 row-threads are added in shared memory.
// partial[split, col] holds the result (the caller's output directly when there is one split).
template <class T, int VEC>
__global__ void sum_columns_partial_kernel(acc_t<T>* partial, const T* in, int64_t rows, int64_t cols,
                                           int64_t rows_per_split) {
  using A = acc_t<T>;
  __shared__ A smem[kTileRows][32 * VEC];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col0 = (int64_t(blockIdx.x) * 32 + tx) * VEC;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r1 = std::min(rows, r0 + rows_per_split);
  A acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = A(0);
  if (col0 < cols) {  // VEC > 1 implies cols % VEC == 0: the whole vector is in range
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += kTileRows) {
      if constexpr (VEC > 1) {
        Vec<T, VEC> v = load_vec<T, VEC>(in + r * cols, col0 / VEC);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += load_acc(v.v[k]);
      } else {
        acc[0] += load_acc(in[r * cols + col0]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) smem[ty][tx * VEC + k] = acc[k];
  __syncthreads();
  for (int j = ty * 32 + tx; j < 32 * VEC; j += 32 * kTileRows) {
    const int64_t col = int64_t(blockIdx.x) * 32 * VEC + j;
    if (col < cols) {
      A s = A(0);
#pragma unroll
      for (int y = 0; y < kTileRows; ++y) s += smem[y][j];
      partial[int64_t(blockIdx.y) * cols + col] = s;
    }
  }
}

// sum_columns, pass 2: out[c] = sum over splits, in split order.
template <class A>
__global__ void sum_columns_final_kernel(float* out, const A* partial, int64_t splits, int64_t cols) {
  for (int64_t c = global_thread(); c < cols; c += grid_threads()) {
    A s = A(0);
    for (int64_t k = 0; k < splits; ++k) s += partial[k * cols + c];
    out[c] = float(s);
  }
}

template <class T>
void launch_sum_columns(Context& ctx, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  constexpr int V = int(16 / sizeof(T));
  const auto* x = static_cast<const T*>(in.data_ptr());
  const bool vec = aligned16(x) && cols % V == 0;
  const int vec_width = vec ? V : 1;
  const int64_t grid_x = (cols + 32 * vec_width - 1) / (32 * vec_width);
  // Enough row splits for a full wave of 256-thread blocks, each split at least 64 rows.
  const int64_t target = int64_t(sm_count(ctx)) * 8;
  int64_t splits = std::clamp<int64_t>((target + grid_x - 1) / grid_x, 1, std::max<int64_t>(1, (rows + 63) / 64));
  splits = std::min<int64_t>(splits, 65535);
  const int64_t rows_per_split = (rows + splits - 1) / splits;
  splits = std::max<int64_t>(1, (rows + rows_per_split - 1) / rows_per_split);
  cudaStream_t s = stream_of(ctx);

  A* partial = nullptr;
  Tensor scratch;
  if (splits == 1 && std::is_same_v<A, float>) {
    partial = reinterpret_cast<A*>(out.data<float>());
  } else {
    scratch = ctx.empty(Shape{splits, cols}, std::is_same_v<A, double> ? DType::F64 : DType::F32);
    partial = static_cast<A*>(scratch.data_ptr());
  }
  dim3 grid{unsigned(grid_x), unsigned(splits)};
  if (vec) sum_columns_partial_kernel<T, V><<<grid, dim3(32, kTileRows), 0, s>>>(partial, x, rows, cols, rows_per_split);
  else sum_columns_partial_kernel<T, 1><<<grid, dim3(32, kTileRows), 0, s>>>(partial, x, rows, cols, rows_per_split);
  CUDA_CHECK_LAUNCH(str_cat("sum_columns_partial_kernel (", in.describe(), ", ", splits, " row splits)"));
  if (static_cast<void*>(partial) != out.data_ptr()) {
    sum_columns_final_kernel<A><<<grid_for(ctx, cols), kThreads, 0, s>>>(out.data<float>(), partial, splits, cols);
    CUDA_CHECK_LAUNCH(str_cat("sum_columns_final_kernel (", in.describe(), ")"));
  }
}

// sum_all, pass 1: one partial per block (fixed grid for a given size and device: deterministic).
template <class T, int VEC>
__global__ void sum_all_partial_kernel(acc_t<T>* partial, const T* in, int64_t n) {
  using A = acc_t<T>;
  const int64_t tid = global_thread(), stride = grid_threads();
  A s = A(0);
  int64_t done = 0;
  if constexpr (VEC > 1) {
    const int64_t groups = n / VEC;
#pragma unroll 4
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<T, VEC> v = load_vec<T, VEC>(in, g);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += load_acc(v.v[k]);
    }
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride) s += load_acc(in[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// sum_all, pass 2: one block of 1024 threads adds the partials.
template <class A>
__global__ void sum_all_final_kernel(float* out, const A* partial, int64_t count) {
  A s = A(0);
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = float(s);
}

template <class T>
void launch_sum_all(Context& ctx, const Tensor& out, const Tensor& in) {
  using A = acc_t<T>;
  constexpr int V = int(16 / sizeof(T));
  const int64_t n = in.numel();
  const auto* x = static_cast<const T*>(in.data_ptr());
  cudaStream_t s = stream_of(ctx);
  const bool vec = aligned16(x);
  unsigned grid = vec ? grid_for(ctx, (n + V - 1) / V) : grid_for(ctx, n);
  Tensor scratch = ctx.empty(Shape{int64_t(grid)}, std::is_same_v<A, double> ? DType::F64 : DType::F32);
  A* partial = static_cast<A*>(scratch.data_ptr());
  if (vec) sum_all_partial_kernel<T, V><<<grid, kThreads, 0, s>>>(partial, x, n);
  else sum_all_partial_kernel<T, 1><<<grid, kThreads, 0, s>>>(partial, x, n);
  CUDA_CHECK_LAUNCH(str_cat("sum_all_partial_kernel (", in.describe(), ")"));
  sum_all_final_kernel<A><<<1, 1024, 0, s>>>(out.data<float>(), partial, int64_t(grid));
  CUDA_CHECK_LAUNCH(str_cat("sum_all_final_kernel (", in.describe(), ")"));
}

template <class T, int VEC>
__global__ void amax_kernel(unsigned int* out, const T* in, int64_t n) {
  const int64_t tid = global_thread(), stride = grid_threads();
  uint32_t key = 0;
  int64_t done = 0;
  if constexpr (VEC > 1) {
    const int64_t groups = n / VEC;
#pragma unroll 4
    for (int64_t g = tid; g < groups; g += stride) {
      Vec<T, VEC> v = load_vec<T, VEC>(in, g);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (std::is_same_v<T, double>) key = max(key, abs_key(__double2float_rn(v.v[k])));
        else key = max(key, abs_key(widen(v.v[k])));
      }
    }
    done = groups * VEC;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    if constexpr (std::is_same_v<T, double>) key = max(key, abs_key(__double2float_rn(in[i])));
    else key = max(key, abs_key(widen(in[i])));
  }
  block_max_to(key, out);
}

template <class T>
void launch_amax(Context& ctx, const Tensor& out, const Tensor& in) {
  constexpr int V = int(16 / sizeof(T));
  const int64_t n = in.numel();
  auto* y = static_cast<unsigned int*>(out.data_ptr());
  const auto* x = static_cast<const T*>(in.data_ptr());
  cudaStream_t s = stream_of(ctx);
  CUDA_CHECK(cudaMemsetAsync(y, 0, sizeof(float), s));
  if (n == 0) return;
  if (aligned16(x)) amax_kernel<T, V><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, s>>>(y, x, n);
  else amax_kernel<T, 1><<<grid_for(ctx, n), kThreads, 0, s>>>(y, x, n);
  CUDA_CHECK_LAUNCH(str_cat("amax_kernel (", in.describe(), ")"));
}

}  // namespace

// ---------------------------------------------------------------- entry points

void cast(Context& ctx, const Tensor& out, const Tensor& in) {
  visit_dtype(in.dtype(), [&]<class TIn>() {
    visit_dtype(out.dtype(), [&]<class TOut>() {
      if constexpr ((std::is_integral_v<TIn> && !std::is_same_v<TOut, float>) ||
                    (std::is_integral_v<TOut> && !std::is_same_v<TIn, float>)) {
        MEGATRON_FAIL("cast: ", dtype_name(in.dtype()), " -> ", dtype_name(out.dtype()), " is not supported");
      } else {
        launch_cast<TOut, TIn>(ctx, out, in);
      }
    });
  });
}

void cast_scaled(Context& ctx, const Tensor& out, const Tensor& amax, const Tensor& in, float scale) {
  visit_arith(in.dtype(), "cast_scaled", [&]<class TIn>() {
    visit_float_dtype(out.dtype(), "cast_scaled", [&]<class TOut>() {
      launch_cast_scaled<TOut, TIn>(ctx, out, amax, in, scale);
    });
  });
}

void fill(Context& ctx, const Tensor& out, double value) {
  // The value is converted once, on the host, by the reference conversion; the kernel stores its bytes.
  alignas(8) unsigned char bytes[8] = {};
  visit_dtype(out.dtype(), [&]<class T>() {
    T v;
    if constexpr (std::is_integral_v<T>) v = saturating_int<T>(value);
    else v = from_double<T>(value);
    std::memcpy(bytes, &v, sizeof(T));
  });
  switch (dtype_size(out.dtype())) {
    case 1: return launch_fill<uint8_t>(ctx, out.data_ptr(), out.numel(), bytes);
    case 2: return launch_fill<uint16_t>(ctx, out.data_ptr(), out.numel(), bytes);
    case 4: return launch_fill<uint32_t>(ctx, out.data_ptr(), out.numel(), bytes);
    case 8: return launch_fill<uint64_t>(ctx, out.data_ptr(), out.numel(), bytes);
    default: MEGATRON_FAIL("fill: unexpected element size of ", out.describe());
  }
}

void fill_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi,
                  uint64_t index_base) {
  visit_float_dtype(out.dtype(), "fill_uniform", [&]<class T>() {
    using A = acc_t<T>;
    constexpr int V = std::max(4, int(16 / sizeof(T)));
    const int64_t n = out.numel();
    T* y = static_cast<T*>(out.data_ptr());
    A a = A(lo), r = std::is_same_v<A, double> ? A(hi - lo) : A(float(hi - lo));
    if (aligned16(y) && index_base % 4 == 0)
      fill_uniform_kernel<T, V, true><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(
          y, n, seed, offset, index_base, a, r);
    else
      fill_uniform_kernel<T, 1, false><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(y, n, seed, offset,
                                                                                          index_base, a, r);
    CUDA_CHECK_LAUNCH(str_cat("fill_uniform_kernel (", out.describe(), ")"));
  });
}

void fill_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std,
                 uint64_t index_base) {
  visit_float_dtype(out.dtype(), "fill_normal", [&]<class T>() {
    using A = acc_t<T>;
    constexpr int V = std::max(4, int(16 / sizeof(T)));
    const int64_t n = out.numel();
    T* y = static_cast<T*>(out.data_ptr());
    if (aligned16(y) && index_base % 2 == 0)
      fill_normal_kernel<T, V, true><<<grid_for(ctx, (n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(
          y, n, seed, offset, index_base, A(mean), A(std));
    else
      fill_normal_kernel<T, 1, false><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(y, n, seed, offset,
                                                                                         index_base, A(mean), A(std));
    CUDA_CHECK_LAUNCH(str_cat("fill_normal_kernel (", out.describe(), ")"));
  });
}

void transpose(Context& ctx, const Tensor& out, const Tensor& in, int64_t batch, int64_t m, int64_t n) {
  switch (dtype_size(in.dtype())) {
    case 1: return launch_transpose<uint8_t>(ctx, out, in, batch, m, n);
    case 2: return launch_transpose<uint16_t>(ctx, out, in, batch, m, n);
    case 4: return launch_transpose<uint32_t>(ctx, out, in, batch, m, n);
    case 8: return launch_transpose<uint64_t>(ctx, out, in, batch, m, n);
    default: MEGATRON_FAIL("transpose: unexpected element size of ", in.describe());
  }
}

void add(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_arith(out.dtype(), "add", [&]<class T>() { launch_map2<T>(ctx, "add", out, a, b, AddOp{}); });
}

void mul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_arith(out.dtype(), "mul", [&]<class T>() { launch_map2<T>(ctx, "mul", out, a, b, MulOp{}); });
}

void scale_rows(Context& ctx, const Tensor& out, const Tensor& in, const Tensor& s) {
  const int64_t n = out.numel(), cols = in.shape().cols();
  visit_arith(out.dtype(), "scale_rows", [&]<class T>() {
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    scale_rows_kernel<T, S><<<grid_for(ctx, n), kThreads, 0, stream_of(ctx)>>>(
        static_cast<T*>(out.data_ptr()), static_cast<const T*>(in.data_ptr()), s.data<S>(), n, cols);
    CUDA_CHECK_LAUNCH(str_cat("scale_rows kernel (", out.describe(), ")"));
  });
}

void axpby(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta) {
  visit_arith(out.dtype(), "axpby", [&]<class T>() {
    using A = acc_t<T>;
    if (beta == 0.0) launch_map2<T>(ctx, "scale", out, x, x, ScaleOp<A>{A(alpha)});
    else launch_map2<T>(ctx, "axpby", out, x, y, AxpbyOp<A>{A(alpha), A(beta)});
  });
}

void sum_rows(Context& ctx, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  visit_arith(in.dtype(), "sum_rows", [&]<class T>() { launch_sum_rows<T>(ctx, out, in, rows, cols); });
}

void sum_columns(Context& ctx, const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  if (rows == 0) {
    CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream_of(ctx)));
    return;
  }
  visit_arith(in.dtype(), "sum_columns", [&]<class T>() { launch_sum_columns<T>(ctx, out, in, rows, cols); });
}

void sum_all(Context& ctx, const Tensor& out, const Tensor& in) {
  if (in.numel() == 0) {
    CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, sizeof(float), stream_of(ctx)));
    return;
  }
  visit_arith(in.dtype(), "sum_all", [&]<class T>() { launch_sum_all<T>(ctx, out, in); });
}

void amax(Context& ctx, const Tensor& out, const Tensor& in) {
  visit_float_dtype(in.dtype(), "amax", [&]<class T>() { launch_amax<T>(ctx, out, in); });
}

}  // namespace megatron::ops::cuda
