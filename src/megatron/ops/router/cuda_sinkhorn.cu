// CUDA Sinkhorn routing ops (sinkhorn.h). The balancing is one block of kSinkhornThreads threads that iterates
// until convergence on the device (no host round trip per iteration, unlike Megatron's loop): the cost matrix
// (tokens x experts, fp32) stays in L2, d1 and the column partial sums in shared memory, d0 in a global scratch
// row. Sums in sinkhorn.h's order, with router_math.h's operations, as the CPU reference.
#include <cuda_runtime.h>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/router/checks.h"
#include "megatron/ops/router/cuda.h"
#include "megatron/ops/router/cuda_rows.cuh"

namespace megatron::ops::cuda {

namespace {

using namespace router_rows;
using enum DType;

constexpr int kMaxExperts = int(router_checks::kCudaMaxExperts);

struct SinkhornArgs {
  float* cost;  // [T, E]: exp(logits), then the balanced costs
  float* d0;    // [T] scratch
  int64_t T;
  int E;
  float inv_t, inv_e, eps, tol;
};

template <class TL>
__global__ void __launch_bounds__(kSinkhornThreads) sinkhorn_kernel(const TL* __restrict__ logits, SinkhornArgs a) {
  __shared__ float d1[kMaxExperts], partial[kMaxExperts], change[kMaxExperts];
  __shared__ int converged;
  const int tid = int(threadIdx.x);
  const int64_t T = a.T, n = a.T * a.E;
  const int E = a.E, G = E < kSinkhornThreads ? kSinkhornThreads / E : 1;
  for (int64_t i = tid; i < n; i += kSinkhornThreads) a.cost[i] = rm::exp_f32(to_f32(logits[i]));
  for (int e = tid; e < E; e += kSinkhornThreads) d1[e] = 1.0f;
  __syncthreads();
  for (int iteration = 0; iteration < kSinkhornMaxIterations; ++iteration) {
    for (int64_t t = tid; t < T; t += kSinkhornThreads) {
      const float* row = a.cost + t * E;
      float s = 0.0f;
      for (int e = 0; e < E; ++e) s = rm::add(s, rm::mul(d1[e], row[e]));
      a.d0[t] = rm::mul(a.inv_t, rm::div(1.0f, rm::add(s, a.eps)));
    }
    __syncthreads();
    // Partial g of column e, g = idx / E: t = g, g + G, ... (consecutive threads read consecutive columns).
    for (int idx = tid; idx < G * E; idx += kSinkhornThreads) {
      const int g = idx / E, e = idx % E;
      float p = 0.0f;
      for (int64_t t = g; t < T; t += G) p = rm::add(p, rm::mul(a.d0[t], a.cost[t * E + e]));
      partial[idx] = p;
    }
    __syncthreads();
    for (int e = tid; e < E; e += kSinkhornThreads) {
      float s = 0.0f;
      for (int g = 0; g < G; ++g) s = rm::add(s, partial[g * E + e]);
      const float next = rm::mul(a.inv_e, rm::div(1.0f, rm::add(s, a.eps)));
      change[e] = rm::magnitude(rm::sub(d1[e], next));
      d1[e] = next;
    }
    __syncthreads();
    if (tid == 0) {
      float error = 0.0f;
      for (int e = 0; e < E; ++e) error = rm::add(error, change[e]);
      converged = !(rm::div(error, float(E)) > a.tol);
    }
    __syncthreads();
    if (converged) break;
  }
  for (int64_t i = tid; i < n; i += kSinkhornThreads)
    a.cost[i] = rm::mul(rm::mul(d1[i % E], a.cost[i]), a.d0[i / E]);
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
  const int64_t T = logits.dim(0);
  const int E = int(logits.dim(1));
  Tensor d0 = ctx.empty({T}, F32);
  const SinkhornArgs a{balanced.data<float>(), d0.data<float>(), T, E, float(1.0 / double(T)),
                       float(1.0 / double(E)), float(1e-8), float(1e-4)};
  auto launch = [&]<class TL>() {
    sinkhorn_kernel<TL><<<1, kSinkhornThreads, 0, ctx.stream()>>>(static_cast<const TL*>(logits.data_ptr()), a);
  };
  switch (logits.dtype()) {
    case F32: launch.template operator()<float>(); break;
    case BF16: launch.template operator()<__nv_bfloat16>(); break;
    case F16: launch.template operator()<__half>(); break;
    default: MEGATRON_FAIL("router_sinkhorn (CUDA): logits dtype ", dtype_name(logits.dtype()), " is not supported");
  }
  CUDA_CHECK_MSG(cudaGetLastError(), " (router_sinkhorn: logits ", logits.describe(), ")");
}

void router_scores_at(Context& ctx, const Tensor& probs, const Tensor& scores, const Tensor& indices) {
  const int64_t n = indices.numel();
  constexpr int kThreads = 256;
  scores_at_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, ctx.stream()>>>(
      probs.data<float>(), scores.data<float>(), indices.data<int32_t>(), n, int(indices.dim(1)), int(scores.dim(1)));
  CUDA_CHECK_MSG(cudaGetLastError(), " (router_scores_at: scores ", scores.describe(), ")");
}

}  // namespace megatron::ops::cuda
