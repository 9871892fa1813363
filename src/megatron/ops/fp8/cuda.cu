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
// The fused casts (fp8_swiglu_cast_transpose, fp8_swiglu_grad_cast_transpose) are the same kernel with
// another source of values: each 16-byte vector of the tile is computed from SwiGLU's inputs
// (ops/activation/swiglu_math.cuh) and rounded to the input dtype, exactly the values the activation op
// would have stored, so the codes and the amax equal those of the two ops run one after the other. The
// gradient's source is paired: one read of dy, gate and up at column j yields output columns j and F + j, so
// its tiles hold 64 columns of each half and every input byte is read once.
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
#include "megatron/ops/activation/swiglu_math.cuh"
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
  int64_t pair_f = 0;  // paired tiles (the SwiGLU gradient): F, the width of each half of the output; else 0
  bool vec_out;        // out aligned to the vector path's store width
  bool vec_out_t;      // out_t 16-byte aligned and rows % 16 == 0: 16-byte stores of 16 rows
};

template <class T>
constexpr int kVec = int(16 / sizeof(T));       // elements per 16-byte load: 8 (bf16, f16) or 4 (f32)

// Where the cast's values come from, one 16-byte vector of V = kVec<T> elements at a time: fetch() issues
// the vector's kLoads 16-byte loads (batched by the caller before any is used), values() turns them into the
// V values in fp32, each exactly representable in T.
// The plain cast: the elements of `in` [rows, cols].
template <class T>
struct PlainSource {
  static constexpr int kLoads = 1;
  static constexpr bool kPaired = false;
  const T* in;
  int64_t cols;
  __device__ void fetch(int64_t r, int64_t c, uint4 (&raw)[kLoads]) const {
    raw[0] = *reinterpret_cast<const uint4*>(in + r * cols + c);
  }
  __device__ void values(const uint4 (&raw)[kLoads], int64_t, float (&f)[kVec<T>]) const {
    const T* e = reinterpret_cast<const T*>(&raw[0]);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) f[k] = to_f32(e[k]);
  }
};

template <class T>
__device__ __forceinline__ float rounded_to(float v) { return to_f32(from_f32<T>(v)); }

// SwiGLU's output [rows, F] from x [rows, 2F] = [gate | up].
template <class T>
struct SwigluSource {
  static constexpr int kLoads = 2;
  static constexpr bool kPaired = false;
  const T* x;
  int64_t f;
  __device__ void fetch(int64_t r, int64_t c, uint4 (&raw)[kLoads]) const {
    raw[0] = *reinterpret_cast<const uint4*>(x + r * 2 * f + c);
    raw[1] = *reinterpret_cast<const uint4*>(x + r * 2 * f + f + c);
  }
  __device__ void values(const uint4 (&raw)[kLoads], int64_t, float (&out)[kVec<T>]) const {
    const T* gate = reinterpret_cast<const T*>(&raw[0]);
    const T* up = reinterpret_cast<const T*>(&raw[1]);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) out[k] = rounded_to<T>(swiglu_value(to_f32(gate[k]), to_f32(up[k])));
  }
};

// SwiGLU's input gradient [rows, 2F] = [dgate | dup] from dy [rows, F] and x [rows, 2F]: a paired source.
// One read of dy, gate and up at column j gives both dgate[j] and dup[j], columns j and F + j of the output,
// so a block's tile holds 64 columns of each half (load_tile_pairs) instead of 128 adjacent ones.
template <class T>
struct SwigluGradSource {
  static constexpr int kLoads = 3;
  static constexpr bool kPaired = true;
  const T* dy;
  const T* x;
  int64_t f;
  __device__ void fetch(int64_t r, int64_t j, uint4 (&raw)[kLoads]) const {
    raw[0] = *reinterpret_cast<const uint4*>(dy + r * f + j);
    raw[1] = *reinterpret_cast<const uint4*>(x + r * 2 * f + j);
    raw[2] = *reinterpret_cast<const uint4*>(x + r * 2 * f + f + j);
  }
  __device__ void values(const uint4 (&raw)[kLoads], float (&dgate)[kVec<T>], float (&dup)[kVec<T>]) const {
    const T* g = reinterpret_cast<const T*>(&raw[0]);
    const T* gate = reinterpret_cast<const T*>(&raw[1]);
    const T* up = reinterpret_cast<const T*>(&raw[2]);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) {
      const float gk = to_f32(g[k]), xk = to_f32(gate[k]);
      dgate[k] = rounded_to<T>(swiglu_grad_gate(gk, xk, to_f32(up[k])));
      dup[k] = rounded_to<T>(swiglu_grad_up(gk, xk));
    }
  }
};

// The codes of V consecutive values (V = 4 or 8), packed 4 to a word, first element in the low byte.
template <__nv_fp8_interpretation_t F, int V>
__device__ __forceinline__ void quantise_vec(const float (&v)[V], float scale, uint32_t (&codes)[V / 4],
                                             int32_t& key) {
#pragma unroll
  for (int w = 0; w < V / 4; ++w) {
    float f[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[k] = v[4 * w + k];
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

// One batch of a thread's loads, issued before any is used: the vectors at column c of tile rows tr_first,
// tr_first + kRowsPerPass, ... (rows r0 + tr); zeros outside the tensor (values computed, codes never stored).
template <int kRowsPerPass, int kBatch, class Source>
__device__ __forceinline__ void fetch_batch(const Source& src, uint4 (&raw)[kBatch][Source::kLoads], int64_t c,
                                            int64_t r0, int tr_first, int64_t rows, bool col_in) {
#pragma unroll
  for (int p = 0; p < kBatch; ++p) {
    const int64_t r = r0 + tr_first + p * kRowsPerPass;
    if (col_in && r < rows) {
      src.fetch(r, c, raw[p]);
    } else {
#pragma unroll
      for (int l = 0; l < Source::kLoads; ++l) raw[p][l] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Vector path of the tile load: the block reads kTile rows of kTile / V vectors from `src`. Loads are issued
// in batches (8 loads per thread) before any is used, to keep enough bytes in flight.
template <class T, __nv_fp8_interpretation_t F, class Source>
__device__ int32_t load_tile_vec(const CastArgs& a, const Source& src, uint32_t (*tile)[kTileWords], int64_t r0,
                                 int64_t c0, float scale) {
  constexpr int V = kVec<T>, kVecsPerRow = kTile / V, kRowsPerPass = kThreads / kVecsPerRow;
  constexpr int kPasses = kTile / kRowsPerPass, kBatch = 8 / Source::kLoads > 1 ? 8 / Source::kLoads : 1;
  static_assert(kPasses % kBatch == 0, "whole batches of passes");
  const int v = threadIdx.x % kVecsPerRow, tr0 = threadIdx.x / kVecsPerRow;
  const int64_t c = c0 + int64_t(v) * V;
  const bool col_in = c < a.cols;  // cols % V == 0: a vector is wholly inside or outside
  int32_t key = 0;
#pragma unroll
  for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
    uint4 raw[kBatch][Source::kLoads];
    fetch_batch<kRowsPerPass>(src, raw, c, r0, tr0 + p0 * kRowsPerPass, a.rows, col_in);
#pragma unroll
    for (int p = 0; p < kBatch; ++p) {
      const int tr = tr0 + (p0 + p) * kRowsPerPass;
      float values[V];
      src.values(raw[p], c, values);
      uint32_t codes[V / 4];
      quantise_vec<F, V>(values, scale, codes, key);
      if (a.out != nullptr && col_in && r0 + tr < a.rows)
        store_codes<V>(a.out + (r0 + tr) * a.cols + c, codes, a.vec_out);
      if constexpr (V == 8) *reinterpret_cast<uint2*>(&tile[tr][swizzle(tr, 2 * v)]) = make_uint2(codes[0], codes[1]);
      else tile[tr][swizzle(tr, v)] = codes[0];
    }
  }
  return key;
}

// The tile load of a paired source: tile columns [0, 64) are output columns j0 + t of the first half, [64, 128)
// columns F + j0 + t of the second; each thread reads one vector at column j of the source and writes its two
// vectors of codes. Loads are batched as in load_tile_vec.
template <class T, __nv_fp8_interpretation_t F, class Source>
__device__ int32_t load_tile_pairs(const CastArgs& a, const Source& src, uint32_t (*tile)[kTileWords], int64_t r0,
                                   int64_t j0, float scale) {
  constexpr int V = kVec<T>, kHalf = kTile / 2, kVecsPerRow = kHalf / V, kRowsPerPass = kThreads / kVecsPerRow;
  constexpr int kPasses = kTile / kRowsPerPass, kBatch = 2;
  static_assert(kPasses % kBatch == 0, "whole batches of passes");
  const int v = threadIdx.x % kVecsPerRow, tr0 = threadIdx.x / kVecsPerRow;
  const int64_t j = j0 + int64_t(v) * V;
  const bool col_in = j < a.pair_f;  // F % V == 0: a vector is wholly inside or outside
  int32_t key = 0;
#pragma unroll
  for (int p0 = 0; p0 < kPasses; p0 += kBatch) {
    uint4 raw[kBatch][Source::kLoads];
    fetch_batch<kRowsPerPass>(src, raw, j, r0, tr0 + p0 * kRowsPerPass, a.rows, col_in);
#pragma unroll
    for (int p = 0; p < kBatch; ++p) {
      const int tr = tr0 + (p0 + p) * kRowsPerPass;
      const int64_t r = r0 + tr;
      float first[V], second[V];
      src.values(raw[p], first, second);
      uint32_t codes[2][V / 4];
      quantise_vec<F, V>(first, scale, codes[0], key);
      quantise_vec<F, V>(second, scale, codes[1], key);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (a.out != nullptr && col_in && r < a.rows)
          store_codes<V>(a.out + r * a.cols + h * a.pair_f + j, codes[h], a.vec_out);
        const int word = (h * kHalf + v * V) / 4;
        if constexpr (V == 8) *reinterpret_cast<uint2*>(&tile[tr][swizzle(tr, word)]) = make_uint2(codes[h][0], codes[h][1]);
        else tile[tr][swizzle(tr, word)] = codes[h][0];
      }
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
    const int tc = cg * 4 + j;
    int64_t c = c0 + tc;  // paired tiles: c0 is j0, and the tile's second half maps to F + j0 + ...
    if (a.pair_f != 0) {
      const int64_t jj = c0 + tc % (kTile / 2);
      if (jj >= a.pair_f) break;
      c = tc < kTile / 2 ? jj : a.pair_f + jj;
    } else if (c >= a.cols) {
      break;
    }
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
// kVecIn false: the element path, plain sources only.
template <class T, __nv_fp8_interpretation_t F, bool kVecIn, class Source>
__global__ void __launch_bounds__(kThreads, 4) cast_transpose_kernel(CastArgs a, Source src) {
  __shared__ alignas(16) uint32_t tile[kTile][kTileWords];  // fp8 codes, words placed by swizzle()
  const int64_t r0 = int64_t(blockIdx.x / a.col_tiles) * kTile;
  const int64_t c0 = int64_t(blockIdx.x % a.col_tiles) * (Source::kPaired ? kTile / 2 : kTile);
  const float scale = *a.scale;
  int32_t key;
  if constexpr (Source::kPaired) key = load_tile_pairs<T, F>(a, src, tile, r0, c0, scale);
  else if constexpr (kVecIn) key = load_tile_vec<T, F>(a, src, tile, r0, c0, scale);
  else key = load_tile_scalar<T, F>(a, tile, r0, c0, scale);
  if (a.out_t != nullptr) {
    __syncthreads();
    store_transposed(a, tile, r0, c0);
  }
  if (a.amax != nullptr) block_max_to(key, a.amax);
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

dim3 cast_grid(const CastArgs& a, const Tensor& in) {
  const int64_t row_tiles = (a.rows + kTile - 1) / kTile;
  MEGATRON_CHECK(row_tiles * a.col_tiles <= INT_MAX, "fp8 cast: ", in.describe(), " has too many ", kTile, "x",
                 kTile, " tiles for one grid");
  return dim3(unsigned(row_tiles * a.col_tiles));
}

template <class T, __nv_fp8_interpretation_t F>
void launch_cast_transpose(Context& ctx, const CastArgs& a, const Tensor& in) {
  const dim3 grid = cast_grid(a, in);
  const PlainSource<T> src{static_cast<const T*>(a.in), a.cols};
  if (aligned(a.in, 16) && a.cols % kVec<T> == 0)
    cast_transpose_kernel<T, F, true><<<grid, kThreads, 0, ctx.stream()>>>(a, src);
  else
    cast_transpose_kernel<T, F, false><<<grid, kThreads, 0, ctx.stream()>>>(a, src);
  CUDA_CHECK_LAUNCH(str_cat("cast_transpose_kernel (", in.describe(), ")"));
}

// The vector path with a fused source (the caller has checked its alignment).
template <class T, __nv_fp8_interpretation_t F, class Source>
void launch_fused_cast(Context& ctx, const CastArgs& a, const Source& src, const Tensor& in) {
  cast_transpose_kernel<T, F, true><<<cast_grid(a, in), kThreads, 0, ctx.stream()>>>(a, src);
  CUDA_CHECK_LAUNCH(str_cat("cast_transpose_kernel with a SwiGLU source (", in.describe(), ")"));
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

namespace {

// The launch arguments of a cast into `out` / `out_t` (either undefined: not wanted) of a [rows, cols] source
// whose elements are `element_bytes` wide; `in` is the plain cast's input (null for fused sources).
CastArgs cast_args(const Tensor& out, const Tensor& out_t, const Tensor& amax, const void* in, int64_t rows,
                   int64_t cols, size_t element_bytes, const Tensor& scale) {
  CastArgs a{.in = in,
             .out = static_cast<uint8_t*>(out.defined() ? out.data_ptr() : nullptr),
             .out_t = static_cast<uint8_t*>(out_t.defined() ? out_t.data_ptr() : nullptr),
             .amax = static_cast<int32_t*>(amax.defined() ? amax.data_ptr() : nullptr),
             .scale = scale.data<float>(),
             .rows = rows,
             .cols = cols,
             .col_tiles = (cols + kTile - 1) / kTile};
  a.vec_out = a.out != nullptr && aligned(a.out, element_bytes == 4 ? 4 : 8);
  a.vec_out_t = a.out_t != nullptr && aligned(a.out_t, 16) && a.rows % 16 == 0;
  return a;
}

bool e4m3_output(const Tensor& out, const Tensor& out_t) {
  return (out.defined() ? out.dtype() : out_t.dtype()) == DType::F8E4M3;
}

// Runs body.template operator()<T, F>() for x's dtype and the outputs' fp8 format.
template <class Body>
void dispatch_cast(const Tensor& x, const Tensor& out, const Tensor& out_t, const char* op, Body&& body) {
  const bool e4m3 = e4m3_output(out, out_t);
  auto with = [&]<class T>() {
    if (e4m3) body.template operator()<T, __NV_E4M3>();
    else body.template operator()<T, __NV_E5M2>();
  };
  switch (x.dtype()) {
    case DType::F32: return with.template operator()<float>();
    case DType::BF16: return with.template operator()<bf16_t>();
    case DType::F16: return with.template operator()<fp16_t>();
    default: MEGATRON_FAIL(op, ": ", x.describe(), " is not an F32, BF16 or F16 input on CUDA");
  }
}

// Whether every input pointer is 16-byte aligned and F a whole number of 16-byte vectors: the fused sources'
// vector loads.
bool fused_vectors_fit(std::initializer_list<const Tensor*> inputs, int64_t f) {
  for (const Tensor* t : inputs)
    if (!aligned(t->data_ptr(), 16)) return false;
  return f % int64_t(16 / dtype_size(inputs.begin()[0]->dtype())) == 0;
}

}  // namespace

void fp8_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale) {
  const CastArgs a = cast_args(out, out_t, amax, in.data_ptr(), in.dim(0), in.dim(1), dtype_size(in.dtype()), scale);
  dispatch_cast(in, out, out_t, "fp8_cast_transpose",
                [&]<class T, __nv_fp8_interpretation_t F>() { launch_cast_transpose<T, F>(ctx, a, in); });
}

bool fp8_swiglu_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                               const Tensor& x, const Tensor& scale) {
  const int64_t rows = x.dim(0), f = x.dim(1) / 2;
  if (!fused_vectors_fit({&x}, f)) return false;
  const CastArgs a = cast_args(out, out_t, amax, nullptr, rows, f, dtype_size(x.dtype()), scale);
  dispatch_cast(x, out, out_t, "fp8_swiglu_cast_transpose", [&]<class T, __nv_fp8_interpretation_t F>() {
    launch_fused_cast<T, F>(ctx, a, SwigluSource<T>{x.data<T>(), f}, x);
  });
  return true;
}

bool fp8_swiglu_grad_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                                    const Tensor& dy, const Tensor& x, const Tensor& scale) {
  const int64_t rows = x.dim(0), f = x.dim(1) / 2;
  if (!fused_vectors_fit({&x, &dy}, f)) return false;
  CastArgs a = cast_args(out, out_t, amax, nullptr, rows, 2 * f, dtype_size(x.dtype()), scale);
  a.pair_f = f;
  a.col_tiles = (f + kTile / 2 - 1) / (kTile / 2);
  dispatch_cast(x, out, out_t, "fp8_swiglu_grad_cast_transpose", [&]<class T, __nv_fp8_interpretation_t F>() {
    launch_fused_cast<T, F>(ctx, a, SwigluGradSource<T>{dy.data<T>(), x.data<T>(), f}, x);
  });
  return true;
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
