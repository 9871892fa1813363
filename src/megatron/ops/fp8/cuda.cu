// CUDA kernels of the fp8 family.
//
// fp8_cast_transpose is bandwidth-bound (a bf16 element moves 2 bytes in and 1 or 2 bytes out), so each
// block owns one 128 x 128 tile and touches global memory once per byte: 16-byte loads of `in` (when the
// pointer is 16-byte aligned and cols is a multiple of the vector width, else element loads), the codes of
// each loaded vector stored straight to `out` (8 or 4 bytes at a time when aligned) and into a shared tile
// of fp8 codes, which is then read back column-wise and written to `out_t` as 16-byte runs of 16 rows
// (when rows % 16 == 0 and out_t is aligned, else byte by byte). Transposing the codes rather than the
// floats keeps the tile at 16 KiB and makes out_t the exact bytes of out. The conversion is the sm_89+
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 instruction, which core/float_types.h's contract (and its CUDA test)
// pins to the host conversions bit for bit. amax: each block reduces int32 keys (scalar.h) and folds them
// into amax with one atomicMax, exact and independent of block order.
//
// The scale ops are tiny (n is the number of scaled tensors): one thread per tensor; the delayed update's
// history roll is done in place, a block owning whole columns and moving them up in chunks of rows.
#include "megatron/ops/fp8/cuda.h"

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/ops/fp8/scalar.h"

namespace megatron::ops::cuda {

namespace {

using fp8_detail::amax_key;

// ---------------------------------------------------------------- cast_transpose

constexpr int kTile = 128;                      // a block's tile: kTile x kTile elements
constexpr int kTileWords = kTile / 4;           // a tile row of fp8 codes as 32-bit words
constexpr int kThreads = 256;
constexpr int kRowGroups = kTile / 16;          // out_t: each thread writes 16 rows x 4 columns
static_assert(kRowGroups * kTileWords == kThreads, "one 16 x 4 block of the transposed tile per thread");

// Where word `word` of tile row `row` lives in shared memory. The transposed read has a warp's threads
// read 8 row groups (16 rows apart) x 4 words: XOR-ing the word with 4 * (row group) puts those 32 words
// in 32 different banks. XOR with a multiple of 4 keeps aligned pairs and quads of words together, so the
// row-wise writes stay 8-byte stores.
__device__ __forceinline__ int swizzle(int row, int word) { return word ^ (((row >> 4) & 7) << 2); }

struct CastArgs {
  const void* in;
  uint8_t* out;        // null: not wanted
  uint8_t* out_t;      // null: not wanted
  int32_t* amax;       // null: not wanted; else the float's bits, max-accumulated as int32
  const float* scale;
  int64_t rows, cols, col_tiles;
  bool vec_out;        // out aligned to the vector path's store width
  bool vec_out_t;      // out_t 16-byte aligned and rows % 16 == 0: 16-byte stores of 16 rows
};

template <class T>
constexpr int kVec = int(16 / sizeof(T));       // elements per 16-byte load: 8 (bf16, f16) or 4 (f32)

// The codes of V consecutive elements (V = 4 or 8), packed 4 to a word, first element in the low byte.
template <__nv_fp8_interpretation_t F, class T, int V>
__device__ __forceinline__ void quantise_vec(const T (&e)[V], float scale, uint32_t (&codes)[V / 4], int32_t& key) {
#pragma unroll
  for (int w = 0; w < V / 4; ++w) {
    float f[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[k] = to_f32(e[4 * w + k]);
      key = max(key, amax_key(f[k]));
    }
    const float2 p01 = make_float2(__fmul_rn(f[0], scale), __fmul_rn(f[1], scale));
    const float2 p23 = make_float2(__fmul_rn(f[2], scale), __fmul_rn(f[3], scale));
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(p01, __NV_SATFINITE, F);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(p23, __NV_SATFINITE, F);
    codes[w] = lo | (hi << 16);
  }
}

template <int V>
__device__ __forceinline__ void store_codes(uint8_t* p, const uint32_t (&codes)[V / 4], bool vectorised) {
  if (vectorised) {
    if constexpr (V == 8) *reinterpret_cast<uint2*>(p) = make_uint2(codes[0], codes[1]);
    else *reinterpret_cast<uint32_t*>(p) = codes[0];
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = uint8_t(codes[k / 4] >> (8 * (k % 4)));
  }
}

// Vector path of the tile load: the block reads kTile rows of kTile / V vectors. Loads are issued in
// batches of kBatch per thread before any is used, to keep enough bytes in flight.
template <class T, __nv_fp8_interpretation_t F>
__device__ int32_t load_tile_vec(const CastArgs& a, uint32_t (*tile)[kTileWords], int64_t r0, int64_t c0, float scale) {
  constexpr int V = kVec<T>, kVecsPerRow = kTile / V, kRowsPerPass = kThreads / kVecsPerRow;
  constexpr int kPasses = kTile / kRowsPerPass, kBatch = 8;
  const int v = threadIdx.x % kVecsPerRow, tr0 = threadIdx.x / kVecsPerRow;
  const int64_t c = c0 + int64_t(v) * V;
  const bool col_in = c < a.cols;  // cols % V == 0: a vector is wholly inside or outside
  const T* in = static_cast<const T*>(a.in);
  int32_t key = 0;
#pragma unroll
  for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int p = 0; p < kBatch; ++p) {
      const int64_t r = r0 + tr0 + (p0 + p) * kRowsPerPass;
      raw[p] = col_in && r < a.rows ? *reinterpret_cast<const uint4*>(in + r * a.cols + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < kBatch; ++p) {
      const int tr = tr0 + (p0 + p) * kRowsPerPass;
      uint32_t codes[V / 4];
      quantise_vec<F>(*reinterpret_cast<const T(*)[V]>(&raw[p]), scale, codes, key);
      if (a.out != nullptr && col_in && r0 + tr < a.rows)
        store_codes<V>(a.out + (r0 + tr) * a.cols + c, codes, a.vec_out);
      if constexpr (V == 8) *reinterpret_cast<uint2*>(&tile[tr][swizzle(tr, 2 * v)]) = make_uint2(codes[0], codes[1]);
      else tile[tr][swizzle(tr, v)] = codes[0];
    }
  }
  return key;
}

// Element path of the tile load (unaligned input or cols not a multiple of the vector width).
template <class T, __nv_fp8_interpretation_t F>
__device__ int32_t load_tile_scalar(const CastArgs& a, uint32_t (*tile)[kTileWords], int64_t r0, int64_t c0,
                                    float scale) {
  const T* in = static_cast<const T*>(a.in);
  int32_t key = 0;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int tr = i / kTile, tc = i % kTile;
    const int64_t r = r0 + tr, c = c0 + tc;
    uint8_t code = 0;
    if (r < a.rows && c < a.cols) {
      const float f = to_f32(in[r * a.cols + c]);
      key = max(key, amax_key(f));
      code = __nv_cvt_float_to_fp8(__fmul_rn(f, scale), __NV_SATFINITE, F);
      if (a.out != nullptr) a.out[r * a.cols + c] = code;
    }
    reinterpret_cast<uint8_t*>(&tile[tr][swizzle(tr, tc / 4)])[tc % 4] = code;
  }
  return key;
}

// 4 words of 4 bytes (rows 0..3 of 4 columns) -> 4 words holding one column each (row 0 in the low byte).
__device__ __forceinline__ void transpose_4x4(const uint32_t (&rows)[4], uint32_t (&cols)[4]) {
  const uint32_t ab_lo = __byte_perm(rows[0], rows[1], 0x5140), ab_hi = __byte_perm(rows[0], rows[1], 0x7362);
  const uint32_t cd_lo = __byte_perm(rows[2], rows[3], 0x5140), cd_hi = __byte_perm(rows[2], rows[3], 0x7362);
  cols[0] = __byte_perm(ab_lo, cd_lo, 0x5410);
  cols[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
  cols[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
  cols[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// Each thread takes 16 tile rows x 4 tile columns and writes 16 bytes to each of 4 out_t rows; the 8
// threads of a 4-column group write 128 contiguous bytes of each of those rows.
__device__ void store_transposed(const CastArgs& a, const uint32_t (*tile)[kTileWords], int64_t r0, int64_t c0) {
  const int rg = threadIdx.x % kRowGroups, cg = threadIdx.x / kRowGroups;
  uint32_t col_words[4][4];  // [column j][rows 4q .. 4q + 3]
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t rows[4], cols[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int tr = rg * 16 + 4 * q + k;
      rows[k] = tile[tr][swizzle(tr, cg)];
    }
    transpose_4x4(rows, cols);
#pragma unroll
    for (int j = 0; j < 4; ++j) col_words[j][q] = cols[j];
  }
  const int64_t r = r0 + rg * 16;
  if (r >= a.rows) return;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t c = c0 + cg * 4 + j;
    if (c >= a.cols) break;
    uint8_t* dst = a.out_t + c * a.rows + r;
    if (a.vec_out_t && r + 16 <= a.rows) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(col_words[j][0], col_words[j][1], col_words[j][2], col_words[j][3]);
    } else {
      for (int k = 0; k < 16 && r + k < a.rows; ++k) dst[k] = uint8_t(col_words[j][k / 4] >> (8 * (k % 4)));
    }
  }
}

// Max of the block's keys, folded into *target with one atomicMax (keys and amax compare as int32).
__device__ void block_max_to(int32_t key, int32_t* target) {
  __shared__ int32_t partial[kThreads / 32];
  key = __reduce_max_sync(0xffffffffu, key);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t k = partial[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) k = max(k, partial[w]);
    atomicMax(target, k);
  }
}

// At most 64 registers, so that 4 blocks (1024 threads, 64 KiB of tiles) share an SM: one block waits on
// its loads while others convert and store.
template <class T, __nv_fp8_interpretation_t F, bool kVecIn>
__global__ void __launch_bounds__(kThreads, 4) cast_transpose_kernel(CastArgs a) {
  __shared__ alignas(16) uint32_t tile[kTile][kTileWords];  // fp8 codes, words placed by swizzle()
  const int64_t r0 = int64_t(blockIdx.x / a.col_tiles) * kTile, c0 = int64_t(blockIdx.x % a.col_tiles) * kTile;
  const float scale = *a.scale;
  int32_t key;
  if constexpr (kVecIn) key = load_tile_vec<T, F>(a, tile, r0, c0, scale);
  else key = load_tile_scalar<T, F>(a, tile, r0, c0, scale);
  if (a.out_t != nullptr) {
    __syncthreads();
    store_transposed(a, tile, r0, c0);
  }
  if (a.amax != nullptr) block_max_to(key, a.amax);
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class T, __nv_fp8_interpretation_t F>
void launch_cast_transpose(Context& ctx, const CastArgs& a, const Tensor& in) {
  const int64_t row_tiles = (a.rows + kTile - 1) / kTile;
  MEGATRON_CHECK(row_tiles * a.col_tiles <= INT_MAX, "fp8_cast_transpose: ", in.describe(), " has too many ", kTile,
                 "x", kTile, " tiles for one grid");
  const dim3 grid(unsigned(row_tiles * a.col_tiles));
  if (aligned(a.in, 16) && a.cols % kVec<T> == 0)
    cast_transpose_kernel<T, F, true><<<grid, kThreads, 0, ctx.stream()>>>(a);
  else
    cast_transpose_kernel<T, F, false><<<grid, kThreads, 0, ctx.stream()>>>(a);
  CUDA_CHECK_LAUNCH(str_cat("cast_transpose_kernel (", in.describe(), ")"));
}

// ---------------------------------------------------------------- scale bookkeeping

constexpr int kScaleThreads = 256;

__global__ void scale_from_amax_kernel(float* scale, float* scale_inv, const float* amax, int64_t n, float fp8_max,
                                       float pow2_margin, bool keep_on_invalid) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = fp8_detail::scale_from_amax(amax[i], scale[i], fp8_max, pow2_margin, keep_on_invalid);
  scale[i] = s;
  scale_inv[i] = fp8_detail::reciprocal(s);
}

// The delayed update: a block owns kHistCols whole columns of the history [L, n]; its kHistLanes rows of
// threads move the rows up kHistChunk at a time (all reads of a chunk before any write of it, so the roll
// is in place), then a max over the lanes gives each column's amax.
constexpr int kHistCols = 32, kHistLanes = 16, kHistRowsPerLane = 4, kHistChunk = kHistLanes * kHistRowsPerLane;

__global__ void __launch_bounds__(kHistCols * kHistLanes)
    delayed_update_kernel(float* h, float* scale, float* scale_inv, int64_t L, int64_t n, float fp8_max,
                          float pow2_margin, bool use_max) {
  __shared__ float partial[kHistLanes][kHistCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = int64_t(blockIdx.x) * kHistCols + tx;
  const bool valid = col < n;
  const float newest = valid ? h[col] : 0.0f;  // row 0, read before the first barrier
  float m = newest;
  for (int64_t a = 0; a + 1 < L; a += kHistChunk) {  // rows a .. a + kHistChunk - 1 (below L - 1) take the next row
    float v[kHistRowsPerLane];
#pragma unroll
    for (int k = 0; k < kHistRowsPerLane; ++k) {
      const int64_t r = a + ty + k * kHistLanes;
      v[k] = valid && r + 1 < L ? h[(r + 1) * n + col] : 0.0f;
      if (valid && r + 1 < L) m = fp8_detail::max_propagating_nan(m, v[k]);
    }
    __syncthreads();  // the rows this chunk overwrites were read (by this chunk or the previous one)
#pragma unroll
    for (int k = 0; k < kHistRowsPerLane; ++k) {
      const int64_t r = a + ty + k * kHistLanes;
      if (valid && r + 1 < L) h[r * n + col] = v[k];
    }
  }
  partial[ty][tx] = m;
  __syncthreads();
  if (ty != 0 || !valid) return;
  float amax = newest;
  if (use_max)
    for (int y = 0; y < kHistLanes; ++y) amax = fp8_detail::max_propagating_nan(amax, partial[y][tx]);
  const float s = fp8_detail::scale_from_amax(amax, scale[col], fp8_max, pow2_margin, /*keep_on_invalid=*/true);
  scale[col] = s;
  scale_inv[col] = fp8_detail::reciprocal(s);
  if (L > 1) h[(L - 1) * n + col] = newest;  // the old row 0 wraps to the end ...
  h[col] = 0.0f;                             // ... and row 0 starts the next iteration at zero
}

}  // namespace

void fp8_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale) {
  CastArgs a{.in = in.data_ptr(),
             .out = static_cast<uint8_t*>(out.defined() ? out.data_ptr() : nullptr),
             .out_t = static_cast<uint8_t*>(out_t.defined() ? out_t.data_ptr() : nullptr),
             .amax = static_cast<int32_t*>(amax.defined() ? amax.data_ptr() : nullptr),
             .scale = scale.data<float>(),
             .rows = in.dim(0),
             .cols = in.dim(1),
             .col_tiles = (in.dim(1) + kTile - 1) / kTile};
  a.vec_out = a.out != nullptr && aligned(a.out, size_t(dtype_size(in.dtype()) == 4 ? 4 : 8));
  a.vec_out_t = a.out_t != nullptr && aligned(a.out_t, 16) && a.rows % 16 == 0;
  const bool e4m3 = (out.defined() ? out.dtype() : out_t.dtype()) == DType::F8E4M3;
  auto launch = [&]<class T>() {
    if (e4m3) launch_cast_transpose<T, __NV_E4M3>(ctx, a, in);
    else launch_cast_transpose<T, __NV_E5M2>(ctx, a, in);
  };
  switch (in.dtype()) {
    case DType::F32: return launch.template operator()<float>();
    case DType::BF16: return launch.template operator()<bf16_t>();
    case DType::F16: return launch.template operator()<fp16_t>();
    default: MEGATRON_FAIL("fp8_cast_transpose: ", in.describe(), " is not an F32, BF16 or F16 input on CUDA");
  }
}

void fp8_scale_from_amax(Context& ctx, const Tensor& scale, const Tensor& scale_inv, const Tensor& amax,
                         float fp8_max, float pow2_margin, bool keep_on_invalid) {
  const int64_t n = amax.numel();
  const unsigned blocks = unsigned((n + kScaleThreads - 1) / kScaleThreads);
  scale_from_amax_kernel<<<blocks, kScaleThreads, 0, ctx.stream()>>>(scale.data<float>(), scale_inv.data<float>(),
                                                                     amax.data<float>(), n, fp8_max, pow2_margin,
                                                                     keep_on_invalid);
  CUDA_CHECK_LAUNCH(str_cat("scale_from_amax_kernel (", amax.describe(), ")"));
}

void fp8_delayed_scaling_update(Context& ctx, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                float fp8_max, float pow2_margin, bool use_max) {
  const int64_t L = history.dim(0), n = history.dim(1);
  const unsigned blocks = unsigned((n + kHistCols - 1) / kHistCols);
  delayed_update_kernel<<<blocks, dim3(kHistCols, kHistLanes), 0, ctx.stream()>>>(
      history.data<float>(), scale.data<float>(), scale_inv.data<float>(), L, n, fp8_max, pow2_margin, use_max);
  CUDA_CHECK_LAUNCH(str_cat("delayed_update_kernel (", history.describe(), ")"));
}

}  // namespace megatron::ops::cuda
