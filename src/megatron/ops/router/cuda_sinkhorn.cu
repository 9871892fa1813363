// CUDA Sinkhorn routing ops (sinkhorn.h). The balancing is one cooperative launch that iterates until
// convergence on the device (no host round trip per iteration, unlike Megatron's loop). Each iteration is three
// grid-wide phases separated by grid barriers: the row scalings d0 (one thread per row, e in order), the column
// sums of each row chunk (one thread per chunk and column, t in order), then block 0 adds each column's chunk
// sums in chunk order, sets d1 and decides whether to stop; every block reads that decision after the barrier.
// The cost matrix (tokens x experts, fp32) stays in L2; d1 is copied into each block's shared memory once per
// iteration. Each phase hands a block one contiguous slab of its items, so small matrices still spread over the
// blocks. Sums in sinkhorn.h's order, with router_math.h's operations, as the CPU reference.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/router/checks.h"
#include "megatron/ops/router/cuda.h"
#include "megatron/ops/router/cuda_rows.cuh"
#include "megatron/runtime/cuda_libraries.h"

namespace megatron::ops::cuda {

namespace {

using namespace router_rows;
using enum DType;
namespace cg = cooperative_groups;

constexpr int kMaxExperts = int(router_checks::kCudaMaxExperts);
constexpr int kThreads = 256;
// About this many cost entries per block: enough blocks that every phase spreads, at most one per SM (a
// cooperative launch needs every block resident at once).
constexpr int64_t kEntriesPerBlock = 2048;

struct SinkhornArgs {
  float* cost;       // [T, E]: exp(logits), then the balanced costs
  float* d0;         // [T] row scalings
  float* d1;         // [E] column scalings, the values of the last completed iteration
  float* chunk_sum;  // [chunks, E] column sums of each row chunk
  int* stop;         // written by block 0 before the iteration's last barrier
  int64_t T, R, chunks;
  int E;
  float inv_t, inv_e, eps, tol;
};

// This block's contiguous share [begin, end) of `items` work items.
struct Slab {
  int64_t begin, end;
};
__device__ Slab block_slab(int64_t items) {
  const int64_t per_block = (items + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min(items, int64_t(blockIdx.x) * per_block);
  return {begin, min(items, begin + per_block)};
}

// d0_t for the rows of this block's slab, from the block's shared copy of d1.
__device__ void scale_rows(const SinkhornArgs& a, const float* d1) {
  const Slab rows = block_slab(a.T);
  for (int64_t t = rows.begin + threadIdx.x; t < rows.end; t += kThreads) {
    const float* row = a.cost + t * a.E;
    float s = 0.0f;
    for (int e = 0; e < a.E; ++e) s = rm::add(s, rm::mul(d1[e], row[e]));
    a.d0[t] = rm::mul(a.inv_t, rm::div(1.0f, rm::add(s, a.eps)));
  }
}

// chunk_sum[c, e] = sum over the rows t of chunk c, in order, of d0_t * cost_te.
__device__ void sum_chunks(const SinkhornArgs& a) {
  const Slab items = block_slab(a.chunks * a.E);
  for (int64_t i = items.begin + threadIdx.x; i < items.end; i += kThreads) {
    const int64_t c = i / a.E, e = i % a.E, last = min(a.T, (c + 1) * a.R);
    float p = 0.0f;
    for (int64_t t = c * a.R; t < last; ++t) p = rm::add(p, rm::mul(a.d0[t], a.cost[t * a.E + e]));
    a.chunk_sum[i] = p;
  }
}

// Block 0: the new d1 from the chunk sums, and whether the iteration stops (old d1 in `d1`).
__device__ void scale_columns(const SinkhornArgs& a, const float* d1, float* change) {
  for (int e = threadIdx.x; e < a.E; e += kThreads) {
    float s = 0.0f;
    for (int64_t c = 0; c < a.chunks; ++c) s = rm::add(s, a.chunk_sum[c * a.E + e]);
    const float next = rm::mul(a.inv_e, rm::div(1.0f, rm::add(s, a.eps)));
    change[e] = rm::magnitude(rm::sub(d1[e], next));
    a.d1[e] = next;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float error = 0.0f;
    for (int e = 0; e < a.E; ++e) error = rm::add(error, change[e]);
    *a.stop = !(rm::div(error, float(a.E)) > a.tol);
  }
}

template <class TL>
__global__ void __launch_bounds__(kThreads) sinkhorn_kernel(const TL* __restrict__ logits, SinkhornArgs a) {
  __shared__ float d1[kMaxExperts], change[kMaxExperts];
  cg::grid_group grid = cg::this_grid();
  const int64_t n = a.T * a.E, stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t i = first; i < n; i += stride) a.cost[i] = rm::exp_f32(to_f32(logits[i]));
  for (int64_t e = first; e < a.E; e += stride) a.d1[e] = 1.0f;
  grid.sync();
  for (int iteration = 0; iteration < kSinkhornMaxIterations; ++iteration) {
    for (int e = threadIdx.x; e < a.E; e += kThreads) d1[e] = a.d1[e];
    __syncthreads();
    scale_rows(a, d1);
    grid.sync();
    sum_chunks(a);
    grid.sync();
    if (blockIdx.x == 0) scale_columns(a, d1, change);
    grid.sync();
    if (*static_cast<volatile int*>(a.stop)) break;
  }
  for (int e = threadIdx.x; e < a.E; e += kThreads) d1[e] = a.d1[e];
  __syncthreads();
  for (int64_t i = first; i < n; i += stride) a.cost[i] = rm::mul(rm::mul(d1[i % a.E], a.cost[i]), a.d0[i / a.E]);
}

__global__ void scores_at_kernel(float* __restrict__ probs, const float* __restrict__ scores,
                                 const int32_t* __restrict__ indices, int64_t n, int k, int E) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t e = indices[i];
  probs[i] = e >= 0 && e < E ? scores[(i / k) * E + e] : __int_as_float(0x7fc00000);  // NaN: not an expert
}

}  // namespace

void router_sinkhorn(Context& ctx, const Tensor& balanced, const Tensor& logits) {
  const int64_t T = logits.dim(0), R = sinkhorn_chunk_rows(T), chunks = (T + R - 1) / R;
  const int E = int(logits.dim(1));
  Tensor d0 = ctx.empty({T}, F32), d1 = ctx.empty({E}, F32), chunk_sum = ctx.empty({chunks, E}, F32);
  Tensor stop = ctx.empty({1}, I32);
  SinkhornArgs a{balanced.data<float>(), d0.data<float>(), d1.data<float>(), chunk_sum.data<float>(),
                 stop.data<int32_t>(), T, R, chunks, E, float(1.0 / double(T)), float(1.0 / double(E)),
                 float(1e-8), float(1e-4)};
  const int sms = ctx.cuda_libraries().properties.multiProcessorCount;
  const int blocks = int(std::clamp<int64_t>((T * E + kEntriesPerBlock - 1) / kEntriesPerBlock, 1, sms));
  auto launch = [&]<class TL>() {
    const void* kernel = reinterpret_cast<const void*>(&sinkhorn_kernel<TL>);
    int resident = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0));
    MEGATRON_CHECK(resident >= 1, "router_sinkhorn (CUDA): the kernel cannot be resident on an SM");
    const TL* x = static_cast<const TL*>(logits.data_ptr());
    void* args[] = {&x, &a};
    CUDA_CHECK_MSG(cudaLaunchCooperativeKernel(kernel, dim3(unsigned(blocks)), dim3(kThreads), args, 0, ctx.stream()),
                   " (router_sinkhorn: logits ", logits.describe(), ", ", blocks, " blocks)");
  };
  switch (logits.dtype()) {
    case F32: launch.template operator()<float>(); break;
    case BF16: launch.template operator()<__nv_bfloat16>(); break;
    case F16: launch.template operator()<__half>(); break;
    default: MEGATRON_FAIL("router_sinkhorn (CUDA): logits dtype ", dtype_name(logits.dtype()), " is not supported");
  }
}

void router_scores_at(Context& ctx, const Tensor& probs, const Tensor& scores, const Tensor& indices) {
  const int64_t n = indices.numel();
  constexpr int kThreads = 256;
  scores_at_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, ctx.stream()>>>(
      probs.data<float>(), scores.data<float>(), indices.data<int32_t>(), n, int(indices.dim(1)), int(scores.dim(1)));
  CUDA_CHECK_MSG(cudaGetLastError(), " (router_scores_at: scores ", scores.describe(), ")");
}

}  // namespace megatron::ops::cuda
