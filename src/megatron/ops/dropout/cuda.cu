// CUDA dropout: each step of a thread handles one Philox block (4 consecutive global indices, so one
// Philox4x32-10 evaluation yields all four words). When index_base is a multiple of 4 and the pointers allow
// it, the 4 elements are one aligned vector load/store; otherwise (and at the ends) element by element.
// fp32 math with explicit round-to-nearest intrinsics (no FMA contraction) so results equal the CPU's bits.
#include "megatron/ops/dropout/cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/core/philox.h"

namespace megatron::ops::cuda {
namespace {

template <class T>
struct alignas(sizeof(T) * 4) Vec4 {
  T v[4];
};

struct Params {
  void* y;
  const void* x;
  const void* bias;      // [h] or null
  const void* residual;  // or null
  int64_t n;
  int64_t h;
  float p;
  float scale;
  uint64_t seed, offset, index_base;
};

template <class T>
__device__ __forceinline__ float dropout_one(const Params& p, const T* x, const T* b, const T* r, int64_t i,
                                             uint32_t word) {
  // Same expression as philox_uniform (core/philox.h).
  const bool keep = float(word >> 8) * (1.0f / 16777216.0f) >= p.p;
  float v = to_f32(x[i]);
  if (b != nullptr) v = __fadd_rn(v, to_f32(b[i % p.h]));
  v = keep ? __fmul_rn(v, p.scale) : 0.f;
  if (r != nullptr) v = __fadd_rn(to_f32(r[i]), v);
  return v;
}

template <class T, bool kVec>
__global__ void __launch_bounds__(256) dropout_kernel(Params p) {
  const T* x = static_cast<const T*>(p.x);
  const T* b = static_cast<const T*>(p.bias);
  const T* r = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  const uint64_t first_block = p.index_base >> 2, last_block = (p.index_base + uint64_t(p.n) - 1) >> 2;
  const int64_t num_blocks = int64_t(last_block - first_block) + 1;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < num_blocks; t += stride) {
    const uint64_t blk = first_block + uint64_t(t);
    const Philox4x32 rnd = philox4x32_10(uint32_t(blk), uint32_t(blk >> 32), uint32_t(p.offset),
                                         uint32_t(p.offset >> 32), uint32_t(p.seed), uint32_t(p.seed >> 32));
    // Local index of the block's first word (negative when index_base is not a multiple of 4).
    const int64_t i0 = int64_t(blk * 4 - p.index_base);
    if (kVec && i0 >= 0 && i0 + 4 <= p.n) {
      // index_base % 4 == 0 here, so i0 % 4 == 0 and (with h % 4 == 0 when there is a bias) the vectors align.
      const Vec4<T> xv = *reinterpret_cast<const Vec4<T>*>(x + i0);
      Vec4<T> bv, rv, out;
      if (b != nullptr) bv = *reinterpret_cast<const Vec4<T>*>(b + i0 % p.h);
      if (r != nullptr) rv = *reinterpret_cast<const Vec4<T>*>(r + i0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool keep = float(rnd.v[j] >> 8) * (1.0f / 16777216.0f) >= p.p;
        float v = to_f32(xv.v[j]);
        if (b != nullptr) v = __fadd_rn(v, to_f32(bv.v[j]));
        v = keep ? __fmul_rn(v, p.scale) : 0.f;
        if (r != nullptr) v = __fadd_rn(to_f32(rv.v[j]), v);
        out.v[j] = from_f32<T>(v);
      }
      *reinterpret_cast<Vec4<T>*>(y + i0) = out;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t i = i0 + j;
        if (i >= 0 && i < p.n) y[i] = from_f32<T>(dropout_one(p, x, b, r, i, rnd.v[j]));
      }
    }
  }
}

bool aligned(const void* ptr, size_t bytes) {
  return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace

void dropout(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual, float p,
             uint64_t seed, uint64_t offset, uint64_t index_base) {
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t stream = ctx.stream();
  Params prm{y.data_ptr(), x.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
             residual.defined() ? residual.data_ptr() : nullptr, n, bias.defined() ? x.shape().cols() : 1, p,
             p < 1.f ? float(1.0 / (1.0 - double(p))) : 0.f, seed, offset, index_base};
  const int64_t philox_blocks = int64_t(((index_base + uint64_t(n) - 1) >> 2) - (index_base >> 2)) + 1;
  const unsigned grid = unsigned(std::min<int64_t>((philox_blocks + 255) / 256, int64_t(1) << 30));
  auto launch = [&]<class T>() {
    const size_t vb = 4 * sizeof(T);
    const bool vec = index_base % 4 == 0 && aligned(prm.y, vb) && aligned(prm.x, vb) && aligned(prm.residual, vb) &&
                     (prm.bias == nullptr || (prm.h % 4 == 0 && aligned(prm.bias, vb)));
    if (vec) dropout_kernel<T, true><<<grid, 256, 0, stream>>>(prm);
    else dropout_kernel<T, false><<<grid, 256, 0, stream>>>(prm);
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching dropout_kernel (", x.describe(), ", index_base ", index_base,
                   ")");
  };
  switch (x.dtype()) {
    case DType::F32: launch.template operator()<float>(); break;
    case DType::BF16: launch.template operator()<__nv_bfloat16>(); break;
    case DType::F16: launch.template operator()<__half>(); break;
    default: MEGATRON_FAIL("dropout (cuda): unsupported dtype ", dtype_name(x.dtype()));
  }
}

}  // namespace megatron::ops::cuda
