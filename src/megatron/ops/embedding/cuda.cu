// CUDA kernels of the embedding family.
//
// Forward: one block per token copies its table row as raw words (16, 4 or 2 bytes, the widest the row size
// and both base addresses allow); the copy is exact for every dtype.
// Backward (deterministic, no atomics):
//   1. keys[i] = ids[i] (or V for an out-of-range id, which then sorts last and is dropped), values[i] = i;
//   2. cub::DeviceRadixSort::SortPairs over the low bits needed for V (stable: equal ids keep position order);
//   3. grid (sorted index i, column chunk): the block whose i starts a run of equal ids sums that run's dout
//      rows in sorted (= position) order in fp32 and adds the sum to dweight[id] (after a memset to 0 when not
//      accumulating). Each output element has exactly one writer.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/ops/embedding/cuda.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kCopyThreads = 128;

template <class TI>
__device__ __forceinline__ int64_t load_id(const TI* ids, int64_t i) {
  return int64_t(ids[i]);
}

template <class Word> __device__ __forceinline__ Word all_ones();
template <> __device__ __forceinline__ uint4 all_ones<uint4>() { return make_uint4(~0u, ~0u, ~0u, ~0u); }
template <> __device__ __forceinline__ uint32_t all_ones<uint32_t>() { return ~0u; }
template <> __device__ __forceinline__ uint16_t all_ones<uint16_t>() { return uint16_t(0xFFFFu); }

// Word: uint4, uint32_t or uint16_t. Rows are `words` words long.
template <class Word, class TI>
__global__ void __launch_bounds__(kCopyThreads)
    embedding_forward_kernel(Word* __restrict__ out, const Word* __restrict__ weight, const TI* __restrict__ ids,
                             int64_t vocab, int64_t words, int64_t vocab_start, int64_t global_vocab) {
  const int64_t token = blockIdx.x;
  const int64_t global_id = load_id(ids, token);
  const int64_t id = global_id - vocab_start;
  Word* dst = out + token * words;
  if (global_id < 0 || global_id >= global_vocab) {
    const Word nan_bits = all_ones<Word>();  // NaN in every float format
    for (int64_t w = threadIdx.x; w < words; w += kCopyThreads) dst[w] = nan_bits;
    return;
  }
  if (id < 0 || id >= vocab) {  // another shard's row: zero bits are 0.0 in every float format
    for (int64_t w = threadIdx.x; w < words; w += kCopyThreads) dst[w] = Word{};
    return;
  }
  const Word* src = weight + id * words;
  for (int64_t w = threadIdx.x; w < words; w += kCopyThreads) dst[w] = src[w];
}

template <class TI>
__global__ void make_sort_keys_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ positions,
                                      const TI* __restrict__ ids, int64_t tokens, int64_t vocab, int64_t vocab_start) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < tokens; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t id = load_id(ids, i) - vocab_start;  // ids of other shards (and invalid ids) get the dropped key
    keys[i] = (id >= 0 && id < vocab) ? uint32_t(id) : uint32_t(vocab);
    positions[i] = int32_t(i);
  }
}

constexpr int kSumThreads = 128;
constexpr int kSumColumnsPerThread = 4;
constexpr int kSumColumns = kSumThreads * kSumColumnsPerThread;

template <class T>
__global__ void __launch_bounds__(kSumThreads)
    embedding_segment_sum_kernel(float* __restrict__ dweight, const T* __restrict__ dout,
                                 const uint32_t* __restrict__ sorted_ids, const int32_t* __restrict__ sorted_positions,
                                 int64_t tokens, int64_t vocab, int64_t hidden) {
  const int64_t i = blockIdx.x;
  const uint32_t id = sorted_ids[i];
  if (id >= vocab) return;                          // out-of-range ids sorted last: dropped
  if (i > 0 && sorted_ids[i - 1] == id) return;     // not the start of this id's run
  const int64_t column0 = int64_t(blockIdx.y) * kSumColumns + threadIdx.x;
  float acc[kSumColumnsPerThread] = {};
  for (int64_t j = i; j < tokens && sorted_ids[j] == id; ++j) {
    const T* row = dout + int64_t(sorted_positions[j]) * hidden;
#pragma unroll
    for (int k = 0; k < kSumColumnsPerThread; ++k) {
      int64_t c = column0 + k * kSumThreads;
      if (c < hidden) acc[k] += to_f32(row[c]);
    }
  }
  float* dst = dweight + int64_t(id) * hidden;
#pragma unroll
  for (int k = 0; k < kSumColumnsPerThread; ++k) {
    int64_t c = column0 + k * kSumThreads;
    if (c < hidden) dst[c] += acc[k];
  }
}

template <class Fn>
void visit_index(DType dtype, Fn&& fn) {
  if (dtype == DType::I32) return fn.template operator()<int32_t>();
  if (dtype == DType::I64) return fn.template operator()<int64_t>();
  MEGATRON_FAIL("embedding (cuda): unsupported ids dtype ", dtype_name(dtype));
}

template <class Fn>
void visit_grad(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::BF16: return fn.template operator()<bf16_t>();
    case DType::F16: return fn.template operator()<fp16_t>();
    default: MEGATRON_FAIL("embedding_backward (cuda): unsupported dout dtype ", dtype_name(dtype));
  }
}

constexpr int64_t kMaxGridX = 2147483647;

int bits_for(uint64_t value) {
  int bits = 1;
  while (bits < 32 && (value >> bits) != 0) ++bits;
  return bits;
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids, int64_t vocab_start,
                       int64_t global_vocab) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = ids.numel(), vocab = weight.dim(0);
  const size_t row_bytes = size_t(weight.dim(1)) * dtype_size(weight.dtype());
  MEGATRON_CHECK(tokens <= kMaxGridX, "embedding_forward: ", tokens, " tokens exceed the grid limit");
  const uintptr_t both = reinterpret_cast<uintptr_t>(out.data_ptr()) | reinterpret_cast<uintptr_t>(weight.data_ptr());
  visit_index(ids.dtype(), [&]<class TI>() {
    auto launch = [&]<class Word>() {
      embedding_forward_kernel<Word, TI><<<unsigned(tokens), kCopyThreads, 0, stream>>>(
          static_cast<Word*>(out.data_ptr()), static_cast<const Word*>(weight.data_ptr()), ids.data<TI>(), vocab,
          int64_t(row_bytes / sizeof(Word)), vocab_start, global_vocab);
    };
    if (row_bytes % 16 == 0 && both % 16 == 0) launch.template operator()<uint4>();
    else if (row_bytes % 4 == 0 && both % 4 == 0) launch.template operator()<uint32_t>();
    else launch.template operator()<uint16_t>();
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching embedding_forward_kernel (weight ", weight.describe(), ", ids ",
                   ids.describe(), ")");
  });
}

void embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate,
                        int64_t vocab_start, int64_t /*global_vocab*/) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = ids.numel(), vocab = dweight.dim(0), hidden = dweight.dim(1);
  MEGATRON_CHECK(tokens < (int64_t(1) << 31), "embedding_backward: ", tokens, " tokens exceed the int32 sort limit");
  MEGATRON_CHECK(vocab < (int64_t(1) << 32) - 1, "embedding_backward: vocabulary ", vocab, " exceeds 32-bit keys");
  if (!accumulate)
    CUDA_CHECK_MSG(cudaMemsetAsync(dweight.data_ptr(), 0, dweight.nbytes(), stream), " (dweight ", dweight.describe(), ")");
  if (tokens == 0 || hidden == 0) return;

  // Keys are uint32 stored in I32 tensors (there is no U32 dtype).
  Tensor keys = ctx.empty({tokens}, DType::I32), sorted_keys = ctx.empty({tokens}, DType::I32);
  uint32_t* keys_in = static_cast<uint32_t*>(keys.data_ptr());
  uint32_t* keys_out = static_cast<uint32_t*>(sorted_keys.data_ptr());
  Tensor positions = ctx.empty({tokens}, DType::I32), sorted_positions = ctx.empty({tokens}, DType::I32);
  {
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((tokens + threads - 1) / threads, 65535);
    visit_index(ids.dtype(), [&]<class TI>() {
      make_sort_keys_kernel<TI><<<unsigned(blocks), threads, 0, stream>>>(keys_in, positions.data<int32_t>(),
                                                                          ids.data<TI>(), tokens, vocab, vocab_start);
    });
    CUDA_CHECK_LAUNCH("make_sort_keys_kernel");
  }

  const int end_bit = bits_for(uint64_t(vocab));  // the sentinel key `vocab` must fit too
  size_t temp_bytes = 0;
  CUDA_CHECK_MSG(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                 positions.data<int32_t>(), sorted_positions.data<int32_t>(),
                                                 int(tokens), 0, end_bit, stream),
                 " (temp-size query, ", tokens, " tokens)");
  Tensor temp = ctx.empty({int64_t(std::max<size_t>(temp_bytes, 1))}, DType::U8);
  CUDA_CHECK_MSG(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in,
                                                 keys_out, positions.data<int32_t>(),
                                                 sorted_positions.data<int32_t>(), int(tokens), 0, end_bit, stream),
                 " (sorting ", tokens, " ids of a ", vocab, "-row table)");

  const int64_t column_chunks = (hidden + kSumColumns - 1) / kSumColumns;
  MEGATRON_CHECK(column_chunks <= 65535, "embedding_backward: hidden size ", hidden, " too large");
  const dim3 grid{unsigned(tokens), unsigned(column_chunks), 1u};
  visit_grad(dout.dtype(), [&]<class T>() {
    embedding_segment_sum_kernel<T><<<grid, kSumThreads, 0, stream>>>(
        dweight.data<float>(), dout.data<T>(), keys_out, sorted_positions.data<int32_t>(), tokens,
        vocab, hidden);
  });
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching embedding_segment_sum_kernel (dout ", dout.describe(), ")");
}

}  // namespace megatron::ops::cuda
