// CUDA kernel of fp8_block_quantize: one block of 256 threads per 128 x 128 tile of `in`. The tile is read
// once from global memory (coalesced along rows) into shared memory as fp32, padded to 129 columns so that
// both a row and a column of the tile are read without bank conflicts; then
//   Rows1x128:     each warp takes 16 tile rows (q: a lane reads every 32nd element of its row) and then 16
//                  tile columns (q_t: a lane reads every 32nd element of its column); the block's amax is a
//                  warp max of int32 keys (ops/fp8/scalar.h), the codes stored by consecutive lanes to
//                  consecutive bytes;
//   Blocks128x128: one block-wide max, then q written along rows and q_t along columns of the tile.
// Loads are 16-byte vectors when the input allows. The conversion is the same cvt.rn.satfinite instruction as fp8_cast_transpose, pinned to the host
// conversions by core/float_types.h's contract, so CPU and CUDA agree bit for bit. The tile's 66 KiB of
// shared memory is dynamic (above the 48 KiB static limit). The kernel is bandwidth-bound (2 bytes in per
// bf16 element, 2 out); this layout favours simplicity over the last 20% of bandwidth.
#include "megatron/ops/fp8_block/cuda.h"

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/ops/fp8/scalar.h"

namespace megatron::ops::cuda {

namespace {

using fp8_detail::amax_key;

constexpr int kTile = 128, kLd = kTile + 1, kThreads = 256, kWarps = kThreads / 32;
constexpr size_t kSharedBytes = size_t(kTile) * kLd * sizeof(float);

struct BlockArgs {
  const void* in;
  int64_t rows, cols, col_tiles;
  uint8_t* q;             // null: not wanted
  float* q_scale_inv;
  int64_t q_ld;           // row length of q_scale_inv
  uint8_t* q_t;           // null: not wanted
  float* q_t_scale_inv;
  int64_t q_t_ld;
  float fp8_max;
};

template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ uint8_t code_of(float v, float scale) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, scale), __NV_SATFINITE, F);
}

__device__ __forceinline__ float amax_of_key(int32_t key) { return __int_as_float(key); }

// One row (q) or column (q_t) of the tile: lane i holds elements i, i + 32, i + 64, i + 96.
template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ float quantise_line(const float (&v)[4], const bool (&in_range)[4], float fp8_max,
                                               uint8_t (&codes)[4]) {
  int32_t key = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (in_range[j]) key = max(key, amax_key(v[j]));
  key = __reduce_max_sync(0xffffffffu, key);
  const float scale = fp8_detail::block_scale_from_amax(amax_of_key(key), fp8_max);
#pragma unroll
  for (int j = 0; j < 4; ++j) codes[j] = code_of<F>(v[j], scale);
  return scale;
}

template <__nv_fp8_interpretation_t F>
__device__ void rows_1x128(const BlockArgs& a, const float* tile, int64_t r0, int64_t c0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (a.q != nullptr) {
    for (int tr = warp; tr < kTile; tr += kWarps) {
      const int64_t r = r0 + tr;
      if (r >= a.rows) break;
      float v[4];
      bool ok[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = tile[tr * kLd + lane + 32 * j];
        ok[j] = c0 + lane + 32 * j < a.cols;
      }
      uint8_t codes[4];
      const float scale = quantise_line<F>(v, ok, a.fp8_max, codes);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (ok[j]) a.q[r * a.cols + c0 + lane + 32 * j] = codes[j];
      if (lane == 0) a.q_scale_inv[(c0 / kTile) * a.q_ld + r] = fp8_detail::pow2_reciprocal(scale);
    }
  }
  if (a.q_t != nullptr) {
    for (int tc = warp; tc < kTile; tc += kWarps) {
      const int64_t c = c0 + tc;
      if (c >= a.cols) break;
      float v[4];
      bool ok[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = tile[(lane + 32 * j) * kLd + tc];
        ok[j] = r0 + lane + 32 * j < a.rows;
      }
      uint8_t codes[4];
      const float scale = quantise_line<F>(v, ok, a.fp8_max, codes);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (ok[j]) a.q_t[c * a.rows + r0 + lane + 32 * j] = codes[j];
      if (lane == 0) a.q_t_scale_inv[(r0 / kTile) * a.q_t_ld + c] = fp8_detail::pow2_reciprocal(scale);
    }
  }
}

template <__nv_fp8_interpretation_t F>
__device__ void blocks_128x128(const BlockArgs& a, const float* tile, int64_t r0, int64_t c0) {
  __shared__ int32_t partial[kWarps];
  const int64_t tile_rows = min(int64_t(kTile), a.rows - r0), tile_cols = min(int64_t(kTile), a.cols - c0);
  int32_t key = 0;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int tr = i / kTile, tc = i % kTile;
    if (tr < tile_rows && tc < tile_cols) key = max(key, amax_key(tile[tr * kLd + tc]));
  }
  key = __reduce_max_sync(0xffffffffu, key);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = key;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) key = max(key, partial[w]);
  const float scale = fp8_detail::block_scale_from_amax(amax_of_key(key), a.fp8_max);
  if (a.q != nullptr)
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
      const int tr = i / kTile, tc = i % kTile;
      if (tr < tile_rows && tc < tile_cols) a.q[(r0 + tr) * a.cols + c0 + tc] = code_of<F>(tile[tr * kLd + tc], scale);
    }
  if (a.q_t != nullptr)
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
      const int tc = i / kTile, tr = i % kTile;
      if (tr < tile_rows && tc < tile_cols) a.q_t[(c0 + tc) * a.rows + r0 + tr] = code_of<F>(tile[tr * kLd + tc], scale);
    }
  if (threadIdx.x == 0) {
    const float scale_inv = fp8_detail::pow2_reciprocal(scale);
    if (a.q != nullptr) a.q_scale_inv[(r0 / kTile) * a.q_ld + c0 / kTile] = scale_inv;
    if (a.q_t != nullptr) a.q_t_scale_inv[(c0 / kTile) * a.q_t_ld + r0 / kTile] = scale_inv;
  }
}

template <class T>
constexpr int kVec = int(16 / sizeof(T));  // elements per 16-byte load

// The tile into shared memory as fp32 (zeros outside the tensor). Vector path (`in` 16-byte aligned, cols a
// multiple of the vector width, so a vector is wholly inside or outside): every thread issues all its
// 16-byte loads before converting any, keeping enough bytes in flight; else one element at a time.
template <class T, bool kVecIn>
__device__ void load_tile(const BlockArgs& a, float* tile, int64_t r0, int64_t c0) {
  const T* in = static_cast<const T*>(a.in);
  if constexpr (kVecIn) {
    constexpr int V = kVec<T>, kVecsPerRow = kTile / V, kPerThread = kTile * kVecsPerRow / kThreads;
    uint4 raw[kPerThread];
#pragma unroll
    for (int p = 0; p < kPerThread; ++p) {
      const int i = threadIdx.x + p * kThreads, tr = i / kVecsPerRow, tc = (i % kVecsPerRow) * V;
      const int64_t r = r0 + tr, c = c0 + tc;
      raw[p] = r < a.rows && c < a.cols ? *reinterpret_cast<const uint4*>(in + r * a.cols + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < kPerThread; ++p) {
      const int i = threadIdx.x + p * kThreads, tr = i / kVecsPerRow, tc = (i % kVecsPerRow) * V;
      const T* e = reinterpret_cast<const T*>(&raw[p]);
#pragma unroll
      for (int k = 0; k < V; ++k) tile[tr * kLd + tc + k] = to_f32(e[k]);
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
      const int tr = i / kTile, tc = i % kTile;
      const int64_t r = r0 + tr, c = c0 + tc;
      tile[tr * kLd + tc] = r < a.rows && c < a.cols ? to_f32(in[r * a.cols + c]) : 0.0f;
    }
  }
}

template <class T, __nv_fp8_interpretation_t F, bool kBlocks, bool kVecIn>
__global__ void __launch_bounds__(kThreads) block_quantize_kernel(BlockArgs a) {
  extern __shared__ float tile[];  // [kTile][kLd]
  const int64_t r0 = int64_t(blockIdx.x / a.col_tiles) * kTile, c0 = int64_t(blockIdx.x % a.col_tiles) * kTile;
  load_tile<T, kVecIn>(a, tile, r0, c0);
  __syncthreads();
  if constexpr (kBlocks) blocks_128x128<F>(a, tile, r0, c0);
  else rows_1x128<F>(a, tile, r0, c0);
}

template <class T, __nv_fp8_interpretation_t F, bool kBlocks>
void launch(Context& ctx, const BlockArgs& a, unsigned tiles, const Tensor& in) {
  const bool vec = reinterpret_cast<uintptr_t>(a.in) % 16 == 0 && a.cols % kVec<T> == 0;
  auto kernel = vec ? block_quantize_kernel<T, F, kBlocks, true> : block_quantize_kernel<T, F, kBlocks, false>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSharedBytes)));
  kernel<<<tiles, kThreads, kSharedBytes, ctx.stream()>>>(a);
  CUDA_CHECK_LAUNCH(str_cat("block_quantize_kernel (", in.describe(), ")"));
}

}  // namespace

void fp8_block_quantize(Context& ctx, const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t,
                        const Tensor& q_t_scale_inv, const Tensor& in, Fp8ScaleLayout layout) {
  BlockArgs a{.in = in.data_ptr(), .rows = in.dim(0), .cols = in.dim(1), .col_tiles = (in.dim(1) + kTile - 1) / kTile};
  for (const Tensor* s : {&q_scale_inv, &q_t_scale_inv})  // the padding entries
    if (s->defined()) CUDA_CHECK(cudaMemsetAsync(s->data_ptr(), 0, size_t(s->nbytes()), ctx.stream()));
  if (q.defined()) {
    a.q = static_cast<uint8_t*>(q.data_ptr());
    a.q_scale_inv = q_scale_inv.data<float>();
    a.q_ld = q_scale_inv.shape().cols();
  }
  if (q_t.defined()) {
    a.q_t = static_cast<uint8_t*>(q_t.data_ptr());
    a.q_t_scale_inv = q_t_scale_inv.data<float>();
    a.q_t_ld = q_t_scale_inv.shape().cols();
  }
  const bool e4m3 = (q.defined() ? q.dtype() : q_t.dtype()) == DType::F8E4M3;
  a.fp8_max = e4m3 ? fp8_detail::kE4M3Max : fp8_detail::kE5M2Max;
  const int64_t tiles = (a.rows + kTile - 1) / kTile * a.col_tiles;
  MEGATRON_CHECK(tiles <= INT_MAX, "fp8_block_quantize: ", in.describe(), " has too many ", kTile, "x", kTile,
                 " tiles for one grid");
  const bool blocks = layout == Fp8ScaleLayout::Blocks128x128;
  auto run = [&]<class T>() {
    if (e4m3 && blocks) launch<T, __NV_E4M3, true>(ctx, a, unsigned(tiles), in);
    else if (e4m3) launch<T, __NV_E4M3, false>(ctx, a, unsigned(tiles), in);
    else if (blocks) launch<T, __NV_E5M2, true>(ctx, a, unsigned(tiles), in);
    else launch<T, __NV_E5M2, false>(ctx, a, unsigned(tiles), in);
  };
  switch (in.dtype()) {
    case DType::F32: return run.template operator()<float>();
    case DType::BF16: return run.template operator()<bf16_t>();
    case DType::F16: return run.template operator()<fp16_t>();
    default: MEGATRON_FAIL("fp8_block_quantize: ", in.describe(), " is not an F32, BF16 or F16 input on CUDA");
  }
}

}  // namespace megatron::ops::cuda
