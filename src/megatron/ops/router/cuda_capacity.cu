// CUDA path of router_drop_over_capacity (see capacity.h). The kept outputs start as copies of the inputs;
// then one block per expert walks the slots in slot order, 1024 at a time, numbering its own slots with a
// block-wide prefix count (warp ballots), so that every block knows each of its slots' position among the
// expert's slots without any host synchronisation.
//   position policy: a slot whose position is >= capacity is dropped in that same walk;
//   probs policy:    a first kernel counts each expert's slots; the walk gathers each expert over capacity's
//                    slots, in slot order, into its segment of a [T * k] scratch list (segments at the prefix
//                    sums of the counts); a third kernel, 1024 of an expert's slots per block, ranks each slot
//                    among its segment: rank = #{others with a higher probability, or an equal one and a lower
//                    slot number}; rank >= capacity drops it. Exactly the CPU's stable sort, compared element
//                    by element: O(n_e^2) comparisons for an expert's n_e slots, spread over n_e / 1024 blocks
//                    and read from shared memory.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/router/cuda.h"

namespace megatron::ops::cuda {

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;

// The number of this block's threads before this one (and in all) whose `match` is set.
struct BlockCount {
  int before, total;
};
__device__ BlockCount block_count(bool match, int* warp_counts) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, match);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  BlockCount c{__popc(ballot & ((1u << lane) - 1u)), 0};
  for (int w = 0; w < kWarps; ++w) {
    const int n = warp_counts[w];
    if (w < warp) c.before += n;
    c.total += n;
  }
  __syncthreads();  // warp_counts is reused by the next call
  return c;
}

__device__ void drop(float* kept_p, int32_t* kept_idx, int64_t i) {
  kept_idx[i] = -1;
  kept_p[i] = 0.0f;
}

__global__ void __launch_bounds__(kThreads) count_kernel(const int32_t* idx, int64_t n, int32_t* counts) {
  __shared__ int warp_counts[kWarps];
  const int e = int(blockIdx.x);
  int64_t total = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kThreads) {
    const int64_t i = c0 + threadIdx.x;
    total += block_count(i < n && idx[i] == e, warp_counts).total;
  }
  if (threadIdx.x == 0) counts[e] = int32_t(total);
}

// One block per expert: its slots numbered in slot order. counts == nullptr: the position policy, slots past
// the capacity dropped here. Else the probs policy: an expert over capacity gathers its slots into its segment
// of `list` (at the prefix sum of the counts before it) for rank_kernel.
__global__ void __launch_bounds__(kThreads)
    position_kernel(const int32_t* idx, float* kept_p, int32_t* kept_idx, int64_t n, int64_t capacity,
                    const int32_t* counts, int32_t* list) {
  __shared__ int warp_counts[kWarps];
  const int e = int(blockIdx.x);
  if (counts != nullptr && counts[e] <= capacity) return;  // uniform over the block
  int64_t offset = 0;
  if (counts != nullptr)
    for (int f = 0; f < e; ++f) offset += counts[f];
  int64_t seen = 0;  // this expert's slots before the current chunk
  for (int64_t c0 = 0; c0 < n; c0 += kThreads) {
    const int64_t i = c0 + threadIdx.x;
    const bool match = i < n && idx[i] == e;
    const BlockCount c = block_count(match, warp_counts);
    const int64_t position = seen + c.before;
    if (match) {
      if (counts == nullptr) {
        if (position >= capacity) drop(kept_p, kept_idx, i);
      } else {
        list[offset + position] = int32_t(i);
      }
    }
    seen += c.total;
  }
}

// Block (c, e) ranks slots c * kThreads ... of expert e's segment against the whole segment, read through
// shared memory a tile at a time (every thread reads the same element: a broadcast). The segment is in slot
// order, so "an equal probability at a lower slot number" is "an equal one earlier in the segment".
__global__ void __launch_bounds__(kThreads)
    rank_kernel(const float* p, float* kept_p, int32_t* kept_idx, int64_t capacity, const int32_t* counts,
                const int32_t* list) {
  __shared__ float tile[kThreads];
  const int e = int(blockIdx.y);
  const int64_t count = counts[e];
  const int64_t first = int64_t(blockIdx.x) * kThreads;
  if (count <= capacity || first >= count) return;  // uniform over the block
  int64_t offset = 0;
  for (int f = 0; f < e; ++f) offset += counts[f];
  const int32_t* mine = list + offset;
  const int64_t a = first + threadIdx.x;
  const bool active = a < count;
  const float pa = active ? p[mine[a]] : 0.0f;
  int64_t rank = 0;
  for (int64_t b0 = 0; b0 < count; b0 += kThreads) {
    __syncthreads();  // the previous tile is consumed
    if (b0 + threadIdx.x < count) tile[threadIdx.x] = p[mine[b0 + threadIdx.x]];
    __syncthreads();
    const int64_t len = count - b0 < kThreads ? count - b0 : kThreads;
    for (int j = 0; j < len; ++j) {
      const float pb = tile[j];
      rank += (pb > pa) || (pb == pa && b0 + j < a);
    }
  }
  if (active && rank >= capacity) drop(kept_p, kept_idx, mine[a]);
}

}  // namespace

void router_drop_over_capacity(Context& ctx, const Tensor& kept_probs, const Tensor& kept_indices, const Tensor& probs,
                               const Tensor& indices, int num_experts, int64_t capacity, bool by_probs) {
  const int64_t n = probs.numel();
  MEGATRON_CHECK(n <= INT32_MAX, "router_drop_over_capacity: ", n, " slots exceed the int32 slot numbers");
  cudaStream_t stream = ctx.stream();
  CUDA_CHECK(cudaMemcpyAsync(kept_probs.data_ptr(), probs.data_ptr(), size_t(probs.nbytes()), cudaMemcpyDeviceToDevice,
                             stream));
  CUDA_CHECK(cudaMemcpyAsync(kept_indices.data_ptr(), indices.data_ptr(), size_t(indices.nbytes()),
                             cudaMemcpyDeviceToDevice, stream));
  if (capacity >= n) return;  // no expert receives more slots than there are
  Tensor counts, list;
  if (by_probs) {
    counts = ctx.empty(Shape{num_experts}, DType::I32);
    list = ctx.empty(Shape{n}, DType::I32);
    count_kernel<<<unsigned(num_experts), kThreads, 0, stream>>>(indices.data<int32_t>(), n, counts.data<int32_t>());
    CUDA_CHECK_LAUNCH("router capacity count_kernel");
  }
  position_kernel<<<unsigned(num_experts), kThreads, 0, stream>>>(
      indices.data<int32_t>(), kept_probs.data<float>(), kept_indices.data<int32_t>(), n, capacity,
      by_probs ? counts.data<int32_t>() : nullptr, by_probs ? list.data<int32_t>() : nullptr);
  CUDA_CHECK_LAUNCH("router capacity position_kernel");
  if (!by_probs) return;
  // Blocks past an expert's count return at once.
  const dim3 grid(unsigned((n + kThreads - 1) / kThreads), unsigned(num_experts));
  rank_kernel<<<grid, kThreads, 0, stream>>>(probs.data<float>(), kept_probs.data<float>(),
                                             kept_indices.data<int32_t>(), capacity, counts.data<int32_t>(),
                                             list.data<int32_t>());
  CUDA_CHECK_LAUNCH("router capacity rank_kernel");
}

}  // namespace megatron::ops::cuda
