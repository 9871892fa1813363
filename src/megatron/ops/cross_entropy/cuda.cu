// CUDA kernels of the cross_entropy family.
//
// Forward: one block per row; each thread keeps a running (max, sum of exp(x - max)) over its share of the
// row, loaded 16 bytes at a time (8 bf16/f16 or 4 f32) after a short unaligned head (rows of an odd vocabulary
// start at any element), then the block combines the pairs. One read of the logits.
// Backward: one block per row again, reading logits and writing dlogits once each; in place is safe because
// every element is read and written by the same thread.
// Fused forward + backward (the training step, where the loss gradient is known before the forward): one
// block per row does both; the second read of the row comes from L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/ops/cross_entropy/cuda.h"

namespace megatron::ops::cuda {
namespace {

// ---- element conversions on the storage types (same layout as the native CUDA types) ----

// 16 bytes of T, loaded and stored as one vector access.
template <class T>
struct alignas(16) Pack {
  static constexpr int N = 16 / int(sizeof(T));
  T v[N];
};

// Elements before the first 16-byte boundary of `p` (p is element aligned), at most n.
template <class T>
__device__ __forceinline__ int64_t head_elements(const void* p, int64_t n) {
  int64_t misalign = int64_t(reinterpret_cast<uintptr_t>(p) & 15u);
  int64_t head = misalign == 0 ? 0 : (16 - misalign) / int64_t(sizeof(T));
  return head < n ? head : n;
}

template <class TI>
__device__ __forceinline__ int64_t read_target(const TI* targets, int64_t row) {
  return int64_t(targets[row]);
}

// Running softmax statistics: sum of exp(x - m). m starts at -FLT_MAX (not -inf) so that exp(m_old - m_new)
// and exp(x - m) never meet inf - inf for -inf logits; a row of only -inf logits gets s = 0, lse = -inf.
struct MaxSum {
  float m = -FLT_MAX;
  float s = 0.f;
};

__device__ __forceinline__ void combine(MaxSum& a, float m2, float s2) {
  float mn = fmaxf(a.m, m2);
  a.s = a.s * __expf(a.m - mn) + s2 * __expf(m2 - mn);
  a.m = mn;
}

template <int N>
__device__ __forceinline__ void update(MaxSum& a, const float (&f)[N]) {
  float vmax = f[0];
#pragma unroll
  for (int k = 1; k < N; ++k) vmax = fmaxf(vmax, f[k]);
  if (vmax > a.m) {
    a.s *= __expf(a.m - vmax);
    a.m = vmax;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) a.s += __expf(f[k] - a.m);
}

// Combines every thread's pair; the result is valid in all threads.
template <int THREADS>
__device__ __forceinline__ MaxSum block_combine(MaxSum a) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024);
  constexpr int kWarps = THREADS / 32;
  __shared__ float sm[kWarps], ss[kWarps];
  __shared__ float result_m, result_s;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, a.m, offset);
    float s2 = __shfl_xor_sync(0xffffffffu, a.s, offset);
    combine(a, m2, s2);
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = a.m;
    ss[warp] = a.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum b;
    if (lane < kWarps) {
      b.m = sm[lane];
      b.s = ss[lane];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      float m2 = __shfl_xor_sync(0xffffffffu, b.m, offset);
      float s2 = __shfl_xor_sync(0xffffffffu, b.s, offset);
      combine(b, m2, s2);
    }
    if (lane == 0) {
      result_m = b.m;
      result_s = b.s;
    }
  }
  __syncthreads();
  MaxSum r;
  r.m = result_m;
  r.s = result_s;
  return r;
}

// The (max, sum of exp(x - max)) pair of one row, valid in every thread of the block.
template <class T, int THREADS>
__device__ __forceinline__ MaxSum row_max_sum(const T* x, int64_t vocab) {
  using P = Pack<T>;
  constexpr int N = P::N;
  const int64_t head = head_elements<T>(x, vocab);
  const int64_t nvec = (vocab - head) / N;
  const P* xv = reinterpret_cast<const P*>(x + head);

  MaxSum a;
  for (int64_t i = threadIdx.x; i < head; i += THREADS) {
    float f[1] = {to_f32(x[i])};
    update(a, f);
  }
  int64_t j = threadIdx.x;
  // Two 16-byte loads in flight per thread before the math.
  for (; j + THREADS < nvec; j += 2 * THREADS) {
    P p0 = xv[j], p1 = xv[j + THREADS];
    float f0[N], f1[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      f0[k] = to_f32(p0.v[k]);
      f1[k] = to_f32(p1.v[k]);
    }
    update(a, f0);
    update(a, f1);
  }
  if (j < nvec) {
    P p0 = xv[j];
    float f0[N];
#pragma unroll
    for (int k = 0; k < N; ++k) f0[k] = to_f32(p0.v[k]);
    update(a, f0);
  }
  for (int64_t i = head + nvec * N + threadIdx.x; i < vocab; i += THREADS) {
    float f[1] = {to_f32(x[i])};
    update(a, f);
  }
  return block_combine<THREADS>(a);
}

template <class T, class TI, int THREADS>
__global__ void __launch_bounds__(THREADS)
    cross_entropy_forward_kernel(float* __restrict__ losses, float* __restrict__ lse, const T* __restrict__ logits,
                                 const TI* __restrict__ targets, int64_t vocab) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  MaxSum total = row_max_sum<T, THREADS>(x, vocab);
  if (threadIdx.x == 0) {
    float l = total.m + __logf(total.s);
    int64_t target = read_target(targets, row);
    lse[row] = l;
    losses[row] = (target >= 0 && target < vocab) ? l - to_f32(x[target]) : __int_as_float(0x7fc00000);
  }
}

// stats [3, tokens]: this shard's (max, sum of exp(x - max), target logit or 0); NaN target logit for a target
// outside the global vocabulary.
template <class T, class TI, int THREADS>
__global__ void __launch_bounds__(THREADS)
    vocab_parallel_stats_kernel(float* __restrict__ stats, const T* __restrict__ logits, const TI* __restrict__ targets,
                                int64_t tokens, int64_t vocab, int64_t vocab_start, int64_t global_vocab) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  MaxSum total = row_max_sum<T, THREADS>(x, vocab);
  if (threadIdx.x == 0) {
    const int64_t target = read_target(targets, row);
    const int64_t local = target - vocab_start;
    float z = 0.f;
    if (target < 0 || target >= global_vocab) z = __int_as_float(0x7fc00000);
    else if (local >= 0 && local < vocab) z = to_f32(x[local]);
    stats[row] = total.m;
    stats[tokens + row] = total.s;
    stats[2 * tokens + row] = z;
  }
}

// One thread per token, the ranks in order (the same bits on every rank).
__global__ void vocab_parallel_combine_kernel(float* __restrict__ losses, float* __restrict__ lse,
                                              const float* __restrict__ stats, int64_t ranks, int64_t tokens) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tokens; t += int64_t(gridDim.x) * blockDim.x) {
    float m = -FLT_MAX;
    for (int64_t r = 0; r < ranks; ++r) m = fmaxf(m, stats[(r * 3) * tokens + t]);
    float s = 0.f, z = 0.f;
    for (int64_t r = 0; r < ranks; ++r) {
      s += stats[(r * 3 + 1) * tokens + t] * __expf(stats[(r * 3) * tokens + t] - m);
      z += stats[(r * 3 + 2) * tokens + t];
    }
    const float l = m + __logf(s);
    lse[t] = l;
    losses[t] = l - z;
  }
}

// dx[v] = dl * (softmax_v - [v == target]) over a row (or a vocabulary shard [vocab_start, vocab_start + vocab)
// of it), from the row's lse; dx may alias x (every element is read and written by the same thread). A target
// outside the global vocabulary makes the row NaN.
template <class T, int THREADS, bool kVector>
__device__ __forceinline__ void row_gradient(T* dx, const T* x, int64_t vocab, int64_t raw_target, float dloss,
                                             float l, int64_t vocab_start, int64_t global_vocab) {
  using P = Pack<T>;
  constexpr int N = P::N;
  const bool valid = raw_target >= 0 && raw_target < global_vocab;
  const float dl = valid ? dloss : __int_as_float(0x7fc00000);
  const int64_t target = valid ? raw_target - vocab_start : -1;  // outside [0, vocab): no one-hot in this shard

  auto grad = [&](float xf, int64_t v) {
    float p = __expf(xf - l);
    return dl * (v == target ? p - 1.f : p);
  };

  const int64_t head = kVector ? head_elements<T>(x, vocab) : vocab;
  for (int64_t i = threadIdx.x; i < head; i += THREADS) dx[i] = from_f32<T>(grad(to_f32(x[i]), i));
  if constexpr (kVector) {
    const int64_t nvec = (vocab - head) / N;
    const P* xv = reinterpret_cast<const P*>(x + head);
    P* dxv = reinterpret_cast<P*>(dx + head);
    for (int64_t j = threadIdx.x; j < nvec; j += THREADS) {
      P p = xv[j];
      P out;
      const int64_t base = head + j * N;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = from_f32<T>(grad(to_f32(p.v[k]), base + k));
      dxv[j] = out;
    }
    for (int64_t i = head + nvec * N + threadIdx.x; i < vocab; i += THREADS) dx[i] = from_f32<T>(grad(to_f32(x[i]), i));
  }
}

// dlogits may alias logits: no __restrict__ on either.
template <class T, class TI, int THREADS, bool kVector>
__global__ void __launch_bounds__(THREADS)
    cross_entropy_backward_kernel(T* dlogits, const float* __restrict__ dlosses, const T* logits,
                                  const TI* __restrict__ targets, const float* __restrict__ lse, int64_t vocab,
                                  int64_t vocab_start, int64_t global_vocab) {
  const int64_t row = blockIdx.x;
  row_gradient<T, THREADS, kVector>(dlogits + row * vocab, logits + row * vocab, vocab, read_target(targets, row),
                                    dlosses[row], lse[row], vocab_start, global_vocab);
}

// Forward and backward of a row in one block (the whole vocabulary): the statistics pass reads the row, the
// gradient pass reads it again while it is still in L2 (a block of 1024 threads per row keeps ~2 rows per SM
// in flight, ~26 MB of bf16 GPT-2 rows, inside the 50 MB L2) and writes dlogits (in place allowed).
template <class T, class TI, int THREADS, bool kVector>
__global__ void __launch_bounds__(THREADS)
    cross_entropy_fused_kernel(float* __restrict__ losses, float* __restrict__ lse, T* dlogits,
                               const float* __restrict__ dlosses, const T* logits, const TI* __restrict__ targets,
                               int64_t vocab) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  const MaxSum total = row_max_sum<T, THREADS>(x, vocab);
  const float l = total.m + __logf(total.s);
  const int64_t target = read_target(targets, row);
  if (threadIdx.x == 0) {
    lse[row] = l;
    losses[row] = (target >= 0 && target < vocab) ? l - to_f32(x[target]) : __int_as_float(0x7fc00000);
  }
  __syncthreads();  // thread 0 has read the target logit before the gradient pass may overwrite it (in place)
  row_gradient<T, THREADS, kVector>(dlogits + row * vocab, x, vocab, target, dlosses[row], l, 0, vocab);
}

template <class Fn>
void visit_logits(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::BF16: return fn.template operator()<bf16_t>();
    case DType::F16: return fn.template operator()<fp16_t>();
    default: MEGATRON_FAIL("cross_entropy (cuda): unsupported logits dtype ", dtype_name(dtype));
  }
}

template <class Fn>
void visit_index(DType dtype, Fn&& fn) {
  if (dtype == DType::I32) return fn.template operator()<int32_t>();
  if (dtype == DType::I64) return fn.template operator()<int64_t>();
  MEGATRON_FAIL("cross_entropy (cuda): unsupported targets dtype ", dtype_name(dtype));
}

// Block size by row length: enough 16-byte vectors per thread to keep loads in flight.
template <class Fn>
void with_threads(int64_t vocab, size_t elem_size, Fn&& fn) {
  int64_t vectors = vocab * int64_t(elem_size) / 16;
  if (vectors >= 2048) return fn.template operator()<512>();
  if (vectors >= 256) return fn.template operator()<256>();
  return fn.template operator()<64>();
}

constexpr int64_t kMaxGridX = 2147483647;

// ---- masked mean ----
constexpr int kReduceThreads = 1024;

__global__ void __launch_bounds__(kReduceThreads)
    masked_mean_loss_kernel(float* __restrict__ out, const float* __restrict__ losses,
                            const float* __restrict__ mask, int64_t tokens) {
  double num = 0, den = 0;
  for (int64_t t = threadIdx.x; t < tokens; t += kReduceThreads) {
    double m = mask != nullptr ? double(mask[t]) : 1.0;
    num += double(losses[t]) * m;
    den += m;
  }
  __shared__ double snum[kReduceThreads], sden[kReduceThreads];
  snum[threadIdx.x] = num;
  sden[threadIdx.x] = den;
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride >>= 1) {
    if (int(threadIdx.x) < stride) {
      snum[threadIdx.x] += snum[threadIdx.x + stride];
      sden[threadIdx.x] += sden[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = sden[0] == 0 ? 0.f : float(snum[0] / sden[0]);
}

__global__ void masked_mean_loss_grad_kernel(float* __restrict__ dlosses, const float* __restrict__ mask,
                                             double denominator, int64_t tokens) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tokens; t += int64_t(gridDim.x) * blockDim.x) {
    double m = mask != nullptr ? double(mask[t]) : 1.0;
    dlosses[t] = float(m / denominator);
  }
}

}  // namespace

void cross_entropy_forward(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  MEGATRON_CHECK(tokens <= kMaxGridX, "cross_entropy_forward: ", tokens, " rows exceed the grid limit");
  visit_logits(logits.dtype(), [&]<class T>() {
    visit_index(targets.dtype(), [&]<class TI>() {
      with_threads(vocab, sizeof(T), [&]<int THREADS>() {
        cross_entropy_forward_kernel<T, TI, THREADS><<<unsigned(tokens), THREADS, 0, stream>>>(
            losses.data<float>(), lse.data<float>(), logits.data<T>(), targets.data<TI>(), vocab);
        CUDA_CHECK_MSG(cudaGetLastError(), " after launching cross_entropy_forward_kernel (logits ", logits.describe(), ")");
      });
    });
  });
}

void cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& dlosses, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse) {
  vocab_parallel_cross_entropy_backward(ctx, dlogits, dlosses, logits, targets, lse, 0, logits.dim(1));
}

void vocab_parallel_cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& dlosses,
                                           const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                           int64_t vocab_start, int64_t global_vocab) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  MEGATRON_CHECK(tokens <= kMaxGridX, "cross_entropy_backward: ", tokens, " rows exceed the grid limit");
  // Vector accesses need both rows to sit at the same offset from a 16-byte boundary.
  const bool vector_ok =
      ((reinterpret_cast<uintptr_t>(dlogits.data_ptr()) - reinterpret_cast<uintptr_t>(logits.data_ptr())) & 15u) == 0;
  visit_logits(logits.dtype(), [&]<class T>() {
    visit_index(targets.dtype(), [&]<class TI>() {
      with_threads(vocab, sizeof(T), [&]<int THREADS>() {
        auto kernel = vector_ok ? cross_entropy_backward_kernel<T, TI, THREADS, true>
                                : cross_entropy_backward_kernel<T, TI, THREADS, false>;
        kernel<<<unsigned(tokens), THREADS, 0, stream>>>(dlogits.data<T>(), dlosses.data<float>(), logits.data<T>(),
                                                         targets.data<TI>(), lse.data<float>(), vocab, vocab_start,
                                                         global_vocab);
        CUDA_CHECK_MSG(cudaGetLastError(), " after launching cross_entropy_backward_kernel (logits ", logits.describe(), ")");
      });
    });
  });
}

void cross_entropy_forward_backward(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& dlogits,
                                    const Tensor& dlosses, const Tensor& logits, const Tensor& targets) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  MEGATRON_CHECK(tokens <= kMaxGridX, "cross_entropy_forward_backward: ", tokens, " rows exceed the grid limit");
  const bool vector_ok =
      ((reinterpret_cast<uintptr_t>(dlogits.data_ptr()) - reinterpret_cast<uintptr_t>(logits.data_ptr())) & 15u) == 0;
  visit_logits(logits.dtype(), [&]<class T>() {
    visit_index(targets.dtype(), [&]<class TI>() {
      auto launch = [&]<int THREADS>() {
        auto kernel = vector_ok ? cross_entropy_fused_kernel<T, TI, THREADS, true>
                                : cross_entropy_fused_kernel<T, TI, THREADS, false>;
        kernel<<<unsigned(tokens), THREADS, 0, stream>>>(losses.data<float>(), lse.data<float>(), dlogits.data<T>(),
                                                         dlosses.data<float>(), logits.data<T>(), targets.data<TI>(),
                                                         vocab);
        CUDA_CHECK_MSG(cudaGetLastError(), " after launching cross_entropy_fused_kernel (logits ", logits.describe(), ")");
      };
      // Long rows: 1024 threads (fewer rows in flight, so the second read hits L2); short ones as the forward.
      if (vocab * int64_t(sizeof(T)) / 16 >= 4096) launch.template operator()<1024>();
      else with_threads(vocab, sizeof(T), launch);
    });
  });
}

void vocab_parallel_cross_entropy_stats(Context& ctx, const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                        int64_t vocab_start, int64_t global_vocab) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  MEGATRON_CHECK(tokens <= kMaxGridX, "vocab_parallel_cross_entropy_stats: ", tokens, " rows exceed the grid limit");
  visit_logits(logits.dtype(), [&]<class T>() {
    visit_index(targets.dtype(), [&]<class TI>() {
      with_threads(vocab, sizeof(T), [&]<int THREADS>() {
        vocab_parallel_stats_kernel<T, TI, THREADS><<<unsigned(tokens), THREADS, 0, stream>>>(
            stats.data<float>(), logits.data<T>(), targets.data<TI>(), tokens, vocab, vocab_start, global_vocab);
        CUDA_CHECK_MSG(cudaGetLastError(), " after launching vocab_parallel_stats_kernel (logits ", logits.describe(), ")");
      });
    });
  });
}

void vocab_parallel_cross_entropy_combine(Context& ctx, const Tensor& losses, const Tensor& lse, const Tensor& stats) {
  cudaStream_t stream = ctx.stream();
  const int64_t ranks = stats.dim(0), tokens = stats.dim(2);
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((tokens + threads - 1) / threads, 4096);
  vocab_parallel_combine_kernel<<<unsigned(blocks), threads, 0, stream>>>(losses.data<float>(), lse.data<float>(),
                                                                          stats.data<float>(), ranks, tokens);
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching vocab_parallel_combine_kernel (stats ", stats.describe(), ")");
}

void masked_mean_loss(Context& ctx, const Tensor& out, const Tensor& losses, const Tensor& loss_mask) {
  cudaStream_t stream = ctx.stream();
  masked_mean_loss_kernel<<<1, kReduceThreads, 0, stream>>>(
      out.data<float>(), losses.data<float>(), loss_mask.defined() ? loss_mask.data<float>() : nullptr, losses.dim(0));
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching masked_mean_loss_kernel (losses ", losses.describe(), ")");
}

void masked_mean_loss_grad(Context& ctx, const Tensor& dlosses, const Tensor& loss_mask, double denominator) {
  cudaStream_t stream = ctx.stream();
  const int64_t tokens = dlosses.dim(0);
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((tokens + threads - 1) / threads, 4096);
  masked_mean_loss_grad_kernel<<<unsigned(blocks), threads, 0, stream>>>(
      dlosses.data<float>(), loss_mask.defined() ? loss_mask.data<float>() : nullptr, denominator, tokens);
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching masked_mean_loss_grad_kernel (dlosses ", dlosses.describe(), ")");
}

}  // namespace megatron::ops::cuda
