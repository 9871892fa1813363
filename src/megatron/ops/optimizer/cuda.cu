// CUDA kernels of the optimizer family: multi-tensor launches.
//
// Each launch carries a batch of up to kMaxTensors tensors in its kernel parameters (pointers, sizes and the
// running count of blocks, < 4 KiB in all), so nothing is copied to the device and no host buffer has to
// outlive the launch. Tensor k owns ceil(n_k / kChunk) consecutive blocks; a block finds its tensor by a
// binary search over the running block counts, then works on its chunk with 4-element vector accesses when
// every pointer of that tensor allows them (scalar otherwise, and for the last < 4 elements of a tensor).
// Tensors are grouped into batches by their dtype combination (one kernel instantiation each).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/ops/optimizer/cuda.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = int64_t(kThreads) * 4 * 4;  // elements per block: 4 vectors of 4 per thread
constexpr int64_t kNormChunk = 4 * kChunk;  // the norm only reads: bigger chunks amortise the block reduction
constexpr int kMaxTensors = 64;


// Four consecutive elements, accessed as one 16-byte (f32) or 8-byte (16-bit types) vector.
template <class T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

template <class T>
bool four_aligned(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// The tensor of block `block` in a batch: the first k with block_end[k] > block.
template <class Batch>
__device__ __forceinline__ int find_tensor(const Batch& b, int block) {
  int lo = 0, hi = b.num - 1;
  while (lo < hi) {
    int mid = (lo + hi) >> 1;
    if (b.block_end[mid] > block) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Block-wide sum in a fixed order (shuffle tree, then the warp sums in order); valid in thread 0.
__device__ __forceinline__ double block_sum(double x) {
  __shared__ double warp_sums[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_down_sync(0xffffffffu, x, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

int64_t blocks_for(int64_t n, int64_t chunk = kChunk) { return (n + chunk - 1) / chunk; }

// Accumulates tensors into batches keyed by their dtype combination and launches a batch when it is full
// or too many blocks; flush() launches the rest.
template <class Batch, class Key>
class Batcher {
 public:
  using Launch = std::function<void(const Key&, const Batch&, int64_t blocks)>;
  explicit Batcher(Launch launch, int64_t chunk = kChunk) : launch_(std::move(launch)), chunk_(chunk) {}

  // Returns the slot for a tensor of n elements (n > 0) in the batch of `key`.
  std::pair<Batch*, int> add(const Key& key, int64_t n) {
    auto [it, fresh] = open_.try_emplace(key);
    Batch& b = it->second;
    if (fresh) b.num = 0;
    const int64_t blocks = b.num == 0 ? 0 : b.block_end[b.num - 1];
    if (b.num == kMaxTensors || blocks + blocks_for(n, chunk_) > kMaxBlocks) {
      launch_(key, b, blocks);
      b.num = 0;
    }
    const int k = b.num++;
    const int64_t start = k == 0 ? 0 : b.block_end[k - 1];
    b.block_end[k] = int32_t(start + blocks_for(n, chunk_));
    return {&b, k};
  }
  void flush() {
    for (auto& [key, b] : open_)
      if (b.num > 0) launch_(key, b, b.block_end[b.num - 1]);
    open_.clear();
  }

 private:
  static constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  Launch launch_;
  int64_t chunk_;
  std::map<Key, Batch> open_;
};

// Runtime dtype -> storage type.
template <class Fn>
void visit_narrow(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::BF16: return fn.template operator()<bf16_t>();
    case DType::F16: return fn.template operator()<fp16_t>();
    default: MEGATRON_FAIL(op, " (cuda): unsupported dtype ", dtype_name(dtype));
  }
}

// ================= AdamW =================

struct AdamBatch {
  float* p[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  const void* g[kMaxTensors];
  void* out[kMaxTensors];
  int64_t n[kMaxTensors];
  float decay[kMaxTensors];  // 1 - lr * weight_decay
  int32_t block_end[kMaxTensors];
  uint8_t vec[kMaxTensors];
  int num;
};

struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  float eps, grad_scale;
};
static_assert(sizeof(AdamBatch) + sizeof(AdamScalars) <= 4000, "kernel parameters must stay under 4 KiB");

__device__ __forceinline__ void adam_update(float& p, float& m, float& v, float g, float decay, const AdamScalars& s) {
  g *= s.grad_scale;
  p *= decay;
  m = fmaf(s.beta1, m, s.one_minus_beta1 * g);
  v = fmaf(s.beta2, v, s.one_minus_beta2 * g * g);
  const float denom = sqrtf(v) * s.inv_sqrt_bc2 + s.eps;
  p -= s.step_size * (m / denom);
}

// TO = void: no model param output.
template <class TG, class TO>
__global__ void __launch_bounds__(kThreads) adamw_kernel(AdamBatch b, AdamScalars s) {
  const int t = find_tensor(b, int(blockIdx.x));
  const int64_t chunk = int64_t(blockIdx.x) - (t > 0 ? b.block_end[t - 1] : 0);
  const int64_t n = b.n[t];
  const int64_t begin = chunk * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  float* __restrict__ p = b.p[t];
  float* __restrict__ m = b.m[t];
  float* __restrict__ v = b.v[t];
  const TG* __restrict__ g = static_cast<const TG*>(b.g[t]);
  const float decay = b.decay[t];

  auto scalar = [&](int64_t i) {
    float pi = p[i], mi = m[i], vi = v[i];
    adam_update(pi, mi, vi, to_f32(g[i]), decay, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (!std::is_void_v<TO>) static_cast<TO*>(b.out[t])[i] = from_f32<TO>(pi);
  };

  int64_t scalar_begin = begin;
  if (b.vec[t]) {
    const int64_t vec_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + 4 * int64_t(threadIdx.x); i < vec_end; i += 4 * kThreads) {
      Four<float> P = *reinterpret_cast<const Four<float>*>(p + i);
      Four<float> M = *reinterpret_cast<const Four<float>*>(m + i);
      Four<float> V = *reinterpret_cast<const Four<float>*>(v + i);
      Four<TG> G = *reinterpret_cast<const Four<TG>*>(g + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) adam_update(P.v[k], M.v[k], V.v[k], to_f32(G.v[k]), decay, s);
      *reinterpret_cast<Four<float>*>(p + i) = P;
      *reinterpret_cast<Four<float>*>(m + i) = M;
      *reinterpret_cast<Four<float>*>(v + i) = V;
      if constexpr (!std::is_void_v<TO>) {
        Four<TO> O;
#pragma unroll
        for (int k = 0; k < 4; ++k) O.v[k] = from_f32<TO>(P.v[k]);
        *reinterpret_cast<Four<TO>*>(static_cast<TO*>(b.out[t]) + i) = O;
      }
    }
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) scalar(i);
}

template <class Fn>
void visit_optional_out(int out_code, Fn&& fn) {
  if (out_code < 0) return fn.template operator()<void>();
  visit_narrow(DType(out_code), "adamw_step", [&]<class T>() { fn.template operator()<T>(); });
}

// ================= L2 norm =================

struct NormBatch {
  const void* x[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t chunk_base[kMaxTensors];  // index of the tensor's first partial
  int32_t block_end[kMaxTensors];
  uint8_t vec[kMaxTensors];
  int num;
};

template <class T>
__global__ void __launch_bounds__(kThreads) l2_partial_kernel(NormBatch b, double* __restrict__ partials) {
  const int t = find_tensor(b, int(blockIdx.x));
  const int64_t chunk = int64_t(blockIdx.x) - (t > 0 ? b.block_end[t - 1] : 0);
  const int64_t begin = chunk * kNormChunk, end = begin + kNormChunk < b.n[t] ? begin + kNormChunk : b.n[t];
  const T* __restrict__ x = static_cast<const T*>(b.x[t]);
  float acc = 0.f;  // at most 64 squares per thread
  int64_t scalar_begin = begin;
  if (b.vec[t]) {
    const int64_t vec_end = begin + (end - begin) / 4 * 4;
#pragma unroll 4
    for (int64_t i = begin + 4 * int64_t(threadIdx.x); i < vec_end; i += 4 * kThreads) {
      Four<T> X = *reinterpret_cast<const Four<T>*>(x + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float f = to_f32(X.v[k]);
        acc = fmaf(f, f, acc);
      }
    }
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) {
    float f = to_f32(x[i]);
    acc = fmaf(f, f, acc);
  }
  double total = block_sum(double(acc));
  if (threadIdx.x == 0) partials[b.chunk_base[t] + chunk] = total;
}

constexpr int kReduceTensors = 256;
struct NormReduceBatch {
  int64_t chunk_begin[kReduceTensors + 1];
  int first_tensor;
};

// One block per tensor: the sum of its partials, in order of the strided thread sums.
__global__ void __launch_bounds__(kThreads)
    l2_tensor_kernel(NormReduceBatch b, const double* __restrict__ partials, double* __restrict__ tensor_sq) {
  const int k = blockIdx.x;
  double s = 0;
  for (int64_t i = b.chunk_begin[k] + threadIdx.x; i < b.chunk_begin[k + 1]; i += kThreads) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) tensor_sq[b.first_tensor + k] = s;
}

__global__ void __launch_bounds__(kThreads) l2_final_kernel(float* __restrict__ out, float* __restrict__ per_tensor,
                                                            const double* __restrict__ tensor_sq, int num) {
  double s = 0;
  for (int i = threadIdx.x; i < num; i += kThreads) {
    s += tensor_sq[i];
    if (per_tensor != nullptr) per_tensor[i] = float(sqrt(tensor_sq[i]));
  }
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = float(sqrt(s));
}

// ================= scale =================

struct ScaleBatch {
  const void* in[kMaxTensors];
  void* out[kMaxTensors];
  int64_t n[kMaxTensors];
  int32_t block_end[kMaxTensors];
  uint8_t vec[kMaxTensors];
  int num;
};

// outs may alias ins (in place): no __restrict__ on the data.
template <class TI, class TO>
__global__ void __launch_bounds__(kThreads)
    scale_kernel(ScaleBatch b, float scale, float* found_inf_f32, int32_t* found_inf_i32) {
  const int t = find_tensor(b, int(blockIdx.x));
  const int64_t chunk = int64_t(blockIdx.x) - (t > 0 ? b.block_end[t - 1] : 0);
  const int64_t begin = chunk * kChunk, end = begin + kChunk < b.n[t] ? begin + kChunk : b.n[t];
  const TI* x = static_cast<const TI*>(b.in[t]);
  TO* y = static_cast<TO*>(b.out[t]);
  bool bad = false;
  auto one = [&](float xf) {
    TO r = from_f32<TO>(xf * scale);
    bad |= !isfinite(to_f32(r));
    return r;
  };
  int64_t scalar_begin = begin;
  if (b.vec[t]) {
    const int64_t vec_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + 4 * int64_t(threadIdx.x); i < vec_end; i += 4 * kThreads) {
      Four<TI> X = *reinterpret_cast<const Four<TI>*>(x + i);
      Four<TO> Y;
#pragma unroll
      for (int k = 0; k < 4; ++k) Y.v[k] = one(to_f32(X.v[k]));
      *reinterpret_cast<Four<TO>*>(y + i) = Y;
    }
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) y[i] = one(to_f32(x[i]));
  const int any_bad = __syncthreads_or(int(bad));
  if (any_bad && threadIdx.x == 0) {
    if (found_inf_f32 != nullptr) *found_inf_f32 = 1.f;  // every writer stores the same value
    if (found_inf_i32 != nullptr) *found_inf_i32 = 1;
  }
}

// Each thread counts its zeros over a grid-stride loop; warps add theirs, and one atomic per warp adds to the
// total (integer additions: the result does not depend on their order).
template <class T>
__global__ void count_zeros_kernel(const T* x, int64_t n, unsigned long long* count) {
  unsigned long long zeros = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    zeros += to_f32(x[i]) == 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) zeros += __shfl_down_sync(0xffffffffu, zeros, offset);
  if ((threadIdx.x & 31) == 0 && zeros != 0) atomicAdd(count, zeros);
}

}  // namespace

void adamw_step(Context& ctx, const std::vector<AdamParamGroupTensors>& tensors, const AdamWConfig& config) {
  cudaStream_t stream = ctx.stream();
  AdamScalars s{};
  s.beta1 = config.beta1;
  s.beta2 = config.beta2;
  s.one_minus_beta1 = float(1.0 - double(config.beta1));
  s.one_minus_beta2 = float(1.0 - double(config.beta2));
  const double bias1 = 1.0 - std::pow(double(config.beta1), double(config.step));
  const double bias2 = 1.0 - std::pow(double(config.beta2), double(config.step));
  s.step_size = float(double(config.lr) / bias1);
  s.inv_sqrt_bc2 = float(1.0 / std::sqrt(bias2));
  s.eps = config.eps;
  s.grad_scale = config.grad_scale;

  using Key = std::pair<int, int>;  // (grad dtype, model_param dtype or -1)
  Batcher<AdamBatch, Key> batcher([&](const Key& key, const AdamBatch& b, int64_t blocks) {
    visit_narrow(DType(key.first), "adamw_step", [&]<class TG>() {
      visit_optional_out(key.second, [&]<class TO>() {
        adamw_kernel<TG, TO><<<unsigned(blocks), kThreads, 0, stream>>>(b, s);
      });
    });
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching adamw_kernel (", b.num, " tensors, ", blocks, " blocks)");
  });
  for (const AdamParamGroupTensors& e : tensors) {
    const int64_t n = e.param.numel();
    if (n == 0) continue;
    const int out_code = e.model_param.defined() ? int(e.model_param.dtype()) : -1;
    auto [b, k] = batcher.add(Key{int(e.grad.dtype()), out_code}, n);
    b->p[k] = e.param.data<float>();
    b->m[k] = e.exp_avg.data<float>();
    b->v[k] = e.exp_avg_sq.data<float>();
    b->g[k] = e.grad.data_ptr();
    b->out[k] = e.model_param.defined() ? e.model_param.data_ptr() : nullptr;
    b->n[k] = n;
    b->decay[k] = float(1.0 - double(config.lr) * double(e.weight_decay.value_or(config.weight_decay)));
    bool vec = four_aligned<float>(b->p[k]) && four_aligned<float>(b->m[k]) && four_aligned<float>(b->v[k]);
    visit_narrow(e.grad.dtype(), "adamw_step", [&]<class TG>() { vec = vec && four_aligned<TG>(b->g[k]); });
    if (e.model_param.defined())
      visit_narrow(e.model_param.dtype(), "adamw_step", [&]<class TO>() { vec = vec && four_aligned<TO>(b->out[k]); });
    b->vec[k] = vec;
  }
  batcher.flush();
}

void multi_tensor_l2_norm(Context& ctx, const Tensor& out, const Tensor& per_tensor_out,
                          const std::vector<Tensor>& tensors) {
  cudaStream_t stream = ctx.stream();
  const int num = int(tensors.size());
  std::vector<int64_t> chunk_begin(size_t(num) + 1, 0);
  for (int i = 0; i < num; ++i)
    chunk_begin[size_t(i) + 1] = chunk_begin[size_t(i)] + blocks_for(tensors[size_t(i)].numel(), kNormChunk);
  Tensor partials = ctx.empty({std::max<int64_t>(chunk_begin.back(), 1)}, DType::F64);
  Tensor tensor_sq = ctx.empty({std::max(num, 1)}, DType::F64);
  double* partials_ptr = partials.data<double>();
  double* tensor_sq_ptr = tensor_sq.data<double>();

  Batcher<NormBatch, int> batcher([&](const int& dtype, const NormBatch& b, int64_t blocks) {
    visit_narrow(DType(dtype), "multi_tensor_l2_norm", [&]<class T>() {
      l2_partial_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(b, partials_ptr);
    });
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching l2_partial_kernel (", b.num, " tensors, ", blocks, " blocks)");
  }, kNormChunk);
  for (int i = 0; i < num; ++i) {
    const Tensor& x = tensors[size_t(i)];
    if (x.numel() == 0) continue;
    auto [b, k] = batcher.add(int(x.dtype()), x.numel());
    b->x[k] = x.data_ptr();
    b->n[k] = x.numel();
    b->chunk_base[k] = chunk_begin[size_t(i)];
    visit_narrow(x.dtype(), "multi_tensor_l2_norm", [&]<class T>() { b->vec[k] = four_aligned<T>(b->x[k]); });
  }
  batcher.flush();

  for (int first = 0; first < num; first += kReduceTensors) {
    const int count = std::min(kReduceTensors, num - first);
    NormReduceBatch r{};
    r.first_tensor = first;
    for (int k = 0; k <= count; ++k) r.chunk_begin[k] = chunk_begin[size_t(first + k)];
    l2_tensor_kernel<<<unsigned(count), kThreads, 0, stream>>>(r, partials_ptr, tensor_sq_ptr);
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching l2_tensor_kernel (", count, " tensors)");
  }
  l2_final_kernel<<<1, kThreads, 0, stream>>>(out.data<float>(),
                                              per_tensor_out.defined() ? per_tensor_out.data<float>() : nullptr,
                                              tensor_sq_ptr, num);
  CUDA_CHECK_MSG(cudaGetLastError(), " after launching l2_final_kernel (", num, " tensors)");
}

void multi_tensor_count_zeros(Context& ctx, const Tensor& out, const std::vector<Tensor>& tensors) {
  cudaStream_t stream = ctx.stream();
  auto* count = reinterpret_cast<unsigned long long*>(out.data<int64_t>());
  CUDA_CHECK_MSG(cudaMemsetAsync(count, 0, sizeof(unsigned long long), stream), " (multi_tensor_count_zeros)");
  for (const Tensor& x : tensors) {  // one launch per tensor: the count is read once per log interval
    if (x.numel() == 0) continue;
    const unsigned blocks = unsigned(std::min<int64_t>(blocks_for(x.numel(), kChunk), 4096));
    visit_narrow(x.dtype(), "multi_tensor_count_zeros", [&]<class T>() {
      count_zeros_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x.data_ptr()), x.numel(), count);
    });
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching count_zeros_kernel (", x.describe(), ")");
  }
}

void multi_tensor_scale(Context& ctx, const std::vector<Tensor>& outs, const Tensor& found_inf,
                        const std::vector<Tensor>& ins, float scale) {
  cudaStream_t stream = ctx.stream();
  float* found_f32 = found_inf.defined() && found_inf.dtype() == DType::F32 ? found_inf.data<float>() : nullptr;
  int32_t* found_i32 = found_inf.defined() && found_inf.dtype() == DType::I32 ? found_inf.data<int32_t>() : nullptr;
  using Key = std::pair<int, int>;  // (in dtype, out dtype)
  Batcher<ScaleBatch, Key> batcher([&](const Key& key, const ScaleBatch& b, int64_t blocks) {
    visit_narrow(DType(key.first), "multi_tensor_scale", [&]<class TI>() {
      visit_narrow(DType(key.second), "multi_tensor_scale", [&]<class TO>() {
        scale_kernel<TI, TO><<<unsigned(blocks), kThreads, 0, stream>>>(b, scale, found_f32, found_i32);
      });
    });
    CUDA_CHECK_MSG(cudaGetLastError(), " after launching scale_kernel (", b.num, " tensors, ", blocks, " blocks)");
  });
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].numel() == 0) continue;
    auto [b, k] = batcher.add(Key{int(ins[i].dtype()), int(outs[i].dtype())}, ins[i].numel());
    b->in[k] = ins[i].data_ptr();
    b->out[k] = outs[i].data_ptr();
    b->n[k] = ins[i].numel();
    bool vec = true;
    visit_narrow(ins[i].dtype(), "multi_tensor_scale", [&]<class T>() { vec = vec && four_aligned<T>(b->in[k]); });
    visit_narrow(outs[i].dtype(), "multi_tensor_scale", [&]<class T>() { vec = vec && four_aligned<T>(b->out[k]); });
    b->vec[k] = vec;
  }
  batcher.flush();
}

}  // namespace megatron::ops::cuda
