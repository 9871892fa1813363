// gemm on cuBLASLt. Row-major D[M,N] = op(A) op(B) is computed as the column-major D^T[N,M] = op(B)^T op(A)^T:
// cuBLASLt's "A" is our B and its "B" is our A, with m = N, n = M, k = K, and every row-major matrix read as
// its column-major transpose with the same leading dimension. So cuBLASLt's TRANSA follows transpose_b and
// TRANSB follows transpose_a; its A/B scale pointers are our b_scale/a_scale; the bias (length N) is per row
// of D^T, as the BIAS epilogue wants; BGRADB (reduction of cuBLASLt's B over k) gives row sums of op(A).
//
// Plans (descriptors + an algorithm) are cached per call signature, including the alignment of every
// pointer (cuBLASLt picks kernels by alignment). The algorithm is the fastest of up to 8 heuristic candidates,
// timed once on the call's own inputs when the plan is built, or the heuristic's first choice when the
// context is deterministic (timing could pick differently from run to run). When a fused epilogue is impossible
// (GELU aux needs N % 8 == 0) or the heuristic offers no algorithm for it, the plain matmul runs and the
// epilogue / bias gradient follow as small kernels (not for fp8 D or amax, where that would change results).
#include "megatron/ops/gemm/cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/cuda_common.cuh"
#include "megatron/ops/gemm/fastest_launch.h"
#include "megatron/runtime/cuda_libraries.h"

namespace megatron::ops::cuda {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Fallback kernels (only when cuBLASLt cannot fuse the epilogue).


__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// d[i] = gelu?(d[i] + bias[i % n]); aux[i] = the pre-GELU value. Grid-stride over all batch * M * N elements.
template <class TD, class TB>
__global__ void bias_gelu_epilogue_kernel(TD* __restrict__ d, TD* __restrict__ aux, const TB* __restrict__ bias,
                                          int64_t total, int64_t n, bool gelu) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float t = to_f32(d[i]);
    if (bias != nullptr) t += to_f32(bias[i % n]);
    if (gelu) {
      if (aux != nullptr) aux[i] = from_f32<TD>(t);
      t = gelu_tanh_f(t);
    }
    d[i] = from_f32<TD>(t);
  }
}

// d[i] *= gelu'(gelu_input[i]) (tanh form), after a plain matmul when cuBLASLt cannot fuse DGELU.
template <class TD>
__global__ void dgelu_epilogue_kernel(TD* __restrict__ d, const TD* __restrict__ gelu_input, int64_t total) {
  const float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_f32(gelu_input[i]);
    const float th = tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x));
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    d[i] = from_f32<TD>(to_f32(d[i]) * grad);
  }
}

// out[m] = sum_k a[k * lda + m]  (A stored [K, M]): one thread per column, coalesced across the warp.
template <class TA, class TO>
__global__ void column_sums_kernel(const TA* __restrict__ a, TO* __restrict__ out, int64_t rows, int64_t cols,
                                   int64_t lda) {
  for (int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; m < cols; m += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t k = 0; k < rows; ++k) s += to_f32(a[k * lda + m]);
    out[m] = from_f32<TO>(s);
  }
}

// out[m] = sum_k a[m * lda + k]  (A stored [M, K]): one warp per row.
template <class TA, class TO>
__global__ void row_sums_kernel(const TA* __restrict__ a, TO* __restrict__ out, int64_t rows, int64_t cols,
                                int64_t lda) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_grid = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t m = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; m < rows; m += warps_per_grid) {
    float s = 0.0f;
    for (int64_t k = lane; k < cols; k += 32) s += to_f32(a[m * lda + k]);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) out[m] = from_f32<TO>(s);
  }
}

template <class Fn>
void visit_native(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: fn.template operator()<float>(); return;
    case DType::F16: fn.template operator()<__half>(); return;
    case DType::BF16: fn.template operator()<__nv_bfloat16>(); return;
    default: MEGATRON_FAIL("gemm: no fallback epilogue kernel for dtype ", dtype_name(t));
  }
}

unsigned grid_for(int64_t work, int threads_per_item_block, const cudaDeviceProp& prop) {
  int64_t blocks = (work + threads_per_item_block - 1) / threads_per_item_block;
  return unsigned(std::clamp<int64_t>(blocks, 1, int64_t(prop.multiProcessorCount) * 16));
}

// ---------------------------------------------------------------------------------------------------------
// cuBLASLt plans.

// Fusing the bias gradient (BGRADB) into the matmul; false routes it through row/column_sums_kernel instead
// (a switch for bisecting should a cuBLASLt version disagree with the reference).
constexpr bool kFuseBiasGrad = true;

cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
    default: MEGATRON_FAIL("gemm: dtype ", dtype_name(t), " has no cuBLASLt matmul type");
  }
}

// Largest power of two <= 256 dividing the address and (for batched operands) the batch stride in bytes.
uint32_t alignment_of(const void* p, int64_t stride_bytes) {
  uint64_t v = uint64_t(reinterpret_cast<uintptr_t>(p)) | 256u | uint64_t(stride_bytes);
  return uint32_t(v & (~v + 1));
}

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLASLt's A, B, C, D
  cublasLtMatmulAlgo_t algo{};
  bool fused = true;  // false: epilogue and bias gradient run as the kernels above, after the matmul
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// Everything one call needs, derived once.
struct Call {
  const Tensor& d;
  const Tensor& a;
  const Tensor& b;
  const GemmOptions& opt;
  const GemmDims& g;
  bool fp8 = false, d_fp8 = false, has_bias = false, has_gelu = false, has_aux = false, has_bgrad = false,
       has_dgelu = false;
  void* bias_ptr = nullptr;  // bias (Bias epilogues) or bias gradient (BGRADB)
  void* aux_ptr = nullptr;   // GELU input: written by GELU_AUX, read by DGELU
  void* c_ptr = nullptr;     // nullptr for an fp8 D (beta == 0)
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_d = 0, align_bias = 0, align_aux = 0;

  // For error messages (built only on failure).
  std::string what() const {
    return str_cat("gemm M=", g.m, " N=", g.n, " K=", g.k, " batch=", g.batch, ": A ", a.describe(),
                   opt.transpose_a ? " (transposed)" : "", ", B ", b.describe(), opt.transpose_b ? " (transposed)" : "",
                   ", D ", d.describe(), ", epilogue ", gemm_epilogue_name(opt.epilogue),
                   has_aux ? " with gelu_input_out" : "", has_dgelu ? " reading gelu_input" : "",
                   has_bgrad ? " with bias_grad_out" : "");
  }
  std::string key() const {
    std::string k = "gemm|";
    auto add = [&](int64_t v) {
      k += std::to_string(v);
      k += '|';
    };
    for (int64_t v : {g.batch, g.m, g.n, g.k, g.lda, g.ldb}) add(v);
    add(g.b_shared);
    add(int(a.dtype()));
    add(int(b.dtype()));
    add(int(d.dtype()));
    add(opt.transpose_a);
    add(opt.transpose_b);
    add(int(opt.epilogue));
    add(has_aux);
    add(has_bgrad);
    add(opt.allow_tf32);
    add(opt.fp8_fast_accum);
    add(int(opt.a_scale_layout));
    add(int(opt.b_scale_layout));
    add(opt.d_scale.defined());
    add(opt.d_amax_out.defined());
    for (uint32_t v : {align_a, align_b, align_c, align_d, align_bias, align_aux}) add(v);
    return k;
  }
};

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value, const Call& c) {
  CUBLAS_CHECK_MSG(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), " (attribute ", int(attr),
                   ", ", c.what(), ")");
}

// cuBLASLt's scale mode for one of our scale layouts (gemm.h; the layouts are cuBLASLt's, seen row-major).
int32_t scale_mode(Fp8ScaleLayout layout) {
  switch (layout) {
    case Fp8ScaleLayout::Tensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8ScaleLayout::Rows1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8ScaleLayout::Blocks128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// The fp8 descriptor attributes: fast accumulation and, with block scaling (validated: both operands), the
// scale modes (cuBLASLt's A is our B and vice versa).
void set_fp8_modes(cublasLtMatmulDesc_t desc, const Call& c) {
  set_attr(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(c.opt.fp8_fast_accum ? 1 : 0), c);
  if (c.opt.a_scale_layout == Fp8ScaleLayout::Tensor) return;
  set_attr(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(c.opt.b_scale_layout), c);
  set_attr(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(c.opt.a_scale_layout), c);
}

// Pointer attributes change from call to call; they are set on the cached descriptor before each matmul.
void set_pointers(const LtPlan& p, const Call& c) {
  if (p.fused) {
    if (c.bias_ptr != nullptr) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias_ptr, c);
    if (c.aux_ptr != nullptr) set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux_ptr, c);
  }
  if (c.fp8) {
    // cuBLASLt's A is our B and vice versa.
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(c.opt.b_scale.data_ptr()), c);
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(c.opt.a_scale.data_ptr()), c);
    if (c.opt.d_scale.defined())
      set_attr(p.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(c.opt.d_scale.data_ptr()), c);
    if (c.opt.d_amax_out.defined()) set_attr(p.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, c.opt.d_amax_out.data_ptr(), c);
  }
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride, const Call& c) {
  cublasLtMatrixLayout_t layout = nullptr;
  CUBLAS_CHECK_MSG(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld), " (", c.what(), ")");
  if (batch > 1) {
    int32_t count = int32_t(batch);
    CUBLAS_CHECK_MSG(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                     " (", c.what(), ")");
    CUBLAS_CHECK_MSG(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof(stride)),
                     " (", c.what(), ")");
  }
  return layout;
}

// How many of the heuristic's candidates are timed when the plan is built (1 in deterministic mode).
constexpr int kAutotuneCandidates = 8;

// Runs each candidate algorithm a few times on the call's real inputs and returns the index of the fastest.
// Everything the matmul writes (D, the GELU aux output, the bias gradient, amax) is assigned by the real call
// that follows, so the timing runs write into the call's own outputs; only an accumulating call (beta != 0,
// which reads D) gets a scratch D, so no input of the real call is disturbed and no output-sized buffer is
// allocated for the big assigning gemms (the logits). Candidates cuBLASLt fails to run are skipped
// (fastest_launch.h). Costs a few milliseconds per plan, once.
int fastest_candidate(Context& ctx, const LtPlan& p, const Call& c, const cublasLtMatmulHeuristicResult_t* results,
                      int count) {
  CudaLibraries& lib = ctx.cuda_libraries();
  cudaStream_t stream = ctx.stream();
  Tensor d_scratch;
  void* d_ptr = c.d.data_ptr();
  if (c.opt.beta != 0.0f) {
    d_scratch = ctx.empty(c.d.shape(), c.d.dtype());
    CUDA_CHECK(cudaMemsetAsync(d_scratch.data_ptr(), 0, d_scratch.nbytes(), stream));
    d_ptr = d_scratch.data_ptr();
  }
  void* c_ptr = c.d_fp8 ? nullptr : d_ptr;
  const float alpha = c.opt.alpha, beta = c.opt.beta;
  const int best = fastest_launch(stream, count, [&](int i) {
    return cublasLtMatmul(lib.cublaslt, p.desc, &alpha, c.b.data_ptr(), p.a, c.a.data_ptr(), p.b, &beta, c_ptr, p.c,
                          d_ptr, p.d, &results[i].algo, lib.cublaslt_workspace.data_ptr(),
                          CudaLibraries::kCublasLtWorkspaceBytes, stream);
  });
  return best < 0 ? 0 : best;  // none ran: the heuristic's first, whose real call then reports cuBLASLt's error
}

// Descriptors + the best algorithm (the fastest of the heuristic's candidates, timed; the first candidate in
// deterministic mode); nullptr when cuBLASLt offers no algorithm.
std::shared_ptr<LtPlan> build_plan(Context& ctx, const Call& c, bool fused) {
  CudaLibraries& lib = ctx.cuda_libraries();
  const GemmOptions& opt = c.opt;
  const GemmDims& g = c.g;
  auto p = std::make_shared<LtPlan>();
  p->fused = fused;

  cublasComputeType_t compute =
      (c.a.dtype() == DType::F32 && opt.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CUBLAS_CHECK_MSG(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F), " (", c.what(), ")");
  cublasOperation_t transa = opt.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t transb = opt.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, transa, c);
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, transb, c);
  if (c.fp8) set_fp8_modes(p->desc, c);

  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (fused) {
    if (c.has_dgelu) epilogue = CUBLASLT_EPILOGUE_DGELU;
    else if (c.has_bgrad) epilogue = CUBLASLT_EPILOGUE_BGRADB;
    else if (c.has_bias && c.has_gelu) epilogue = c.has_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    else if (c.has_gelu) epilogue = c.has_aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    else if (c.has_bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
    if (c.has_aux || c.has_dgelu) {
      set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(g.n), c);
      if (g.batch > 1) set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, int64_t(g.m * g.n), c);
    }
    if (c.has_bias && c.fp8) {
      int32_t bias_type = int32_t(cuda_dtype(opt.bias.dtype()));
      set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, c);
    }
  }
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, c);
  set_pointers(*p, c);  // the heuristic reads the bias / aux pointers' alignment

  // Layouts (column-major view of the row-major tensors; see the top of the file).
  const int64_t batch = g.batch;
  p->a = opt.transpose_b ? make_layout(cuda_dtype(c.b.dtype()), g.k, g.n, g.ldb, batch, g.stride_b(), c)
                         : make_layout(cuda_dtype(c.b.dtype()), g.n, g.k, g.ldb, batch, g.stride_b(), c);
  p->b = opt.transpose_a ? make_layout(cuda_dtype(c.a.dtype()), g.m, g.k, g.lda, batch, g.stride_a(), c)
                         : make_layout(cuda_dtype(c.a.dtype()), g.k, g.m, g.lda, batch, g.stride_a(), c);
  // An fp8 D takes a 16-bit C type (C itself is not read: beta == 0).
  cudaDataType_t c_type = c.d_fp8 ? CUDA_R_16BF : cuda_dtype(c.d.dtype());
  p->c = make_layout(c_type, g.n, g.m, g.n, batch, g.stride_d(), c);
  p->d = make_layout(cuda_dtype(c.d.dtype()), g.n, g.m, g.n, batch, g.stride_d(), c);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK_MSG(cublasLtMatmulPreferenceCreate(&pref), " (", c.what(), ")");
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)> guard(
      pref, &cublasLtMatmulPreferenceDestroy);
  uint64_t workspace = CudaLibraries::kCublasLtWorkspaceBytes;
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    CUBLAS_CHECK_MSG(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), " (", c.what(), ")");
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
  // cuBLASLt assumes 256-byte aligned matrices unless told otherwise; tensors may be views at any offset.
  // (cuBLASLt's A is our B.)
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, c.align_b);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, c.align_a);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c.align_c);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c.align_d);

  cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates]{};
  int found = 0;
  const int wanted = ctx.deterministic() ? 1 : kAutotuneCandidates;
  cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lib.cublaslt, p->desc, p->a, p->b, p->c, p->d, pref, wanted, results, &found);
  if (status == CUBLAS_STATUS_SUCCESS && found == 0) return nullptr;
  // A fused epilogue cuBLASLt rejects (for whatever reason) falls back to the plain plan, whose own failure,
  // if any, is the one reported.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status != CUBLAS_STATUS_SUCCESS && epilogue != CUBLASLT_EPILOGUE_DEFAULT))
    return nullptr;
  CUBLAS_CHECK_MSG(status, " (cublasLtMatmulAlgoGetHeuristic for ", c.what(), ")");
  const int best = found > 1 ? fastest_candidate(ctx, *p, c, results, found) : 0;
  p->algo = results[best].algo;
  return p;
}

void run_fallback_epilogue(Context& ctx, const Call& c) {
  cudaStream_t stream = ctx.stream();
  const cudaDeviceProp& prop = ctx.cuda_libraries().properties;
  const GemmDims& g = c.g;
  if (c.has_bias || c.has_gelu) {
    const int64_t total = g.batch * g.m * g.n;
    const unsigned grid = grid_for(total, 256, prop);
    DType bias_dtype = c.has_bias ? c.opt.bias.dtype() : c.d.dtype();
    visit_native(c.d.dtype(), [&]<class TD>() {
      visit_native(bias_dtype, [&]<class TB>() {
        if constexpr (std::is_same_v<TD, TB> || (std::is_same_v<TD, float> && std::is_same_v<TB, __nv_bfloat16>)) {
          bias_gelu_epilogue_kernel<TD, TB><<<grid, 256, 0, stream>>>(
              static_cast<TD*>(c.d.data_ptr()), static_cast<TD*>(c.aux_ptr), static_cast<const TB*>(c.bias_ptr), total,
              g.n, c.has_gelu);
          CUDA_CHECK_LAUNCH("bias_gelu_epilogue_kernel");
        } else {
          MEGATRON_FAIL("gemm: no fallback epilogue for D ", c.d.describe(), " with bias ", c.opt.bias.describe());
        }
      });
    });
  }
  if (c.has_dgelu) {
    const int64_t total = g.batch * g.m * g.n;
    visit_native(c.d.dtype(), [&]<class TD>() {
      dgelu_epilogue_kernel<TD><<<grid_for(total, 256, prop), 256, 0, stream>>>(
          static_cast<TD*>(c.d.data_ptr()), static_cast<const TD*>(c.aux_ptr), total);
      CUDA_CHECK_LAUNCH("dgelu_epilogue_kernel");
    });
  }
  if (c.has_bgrad) {
    visit_native(c.a.dtype(), [&]<class TA>() {
      visit_native(c.d.dtype(), [&]<class TO>() {
        const TA* a = static_cast<const TA*>(c.a.data_ptr());
        TO* out = static_cast<TO*>(c.bias_ptr);
        if (c.opt.transpose_a) {  // A is [K, M]
          column_sums_kernel<TA, TO><<<grid_for(g.m, 256, prop), 256, 0, stream>>>(a, out, g.k, g.m, g.lda);
          CUDA_CHECK_LAUNCH("column_sums_kernel");
        } else {  // A is [M, K]
          row_sums_kernel<TA, TO><<<grid_for(g.m, 8, prop), 256, 0, stream>>>(a, out, g.m, g.k, g.lda);
          CUDA_CHECK_LAUNCH("row_sums_kernel");
        }
      });
    });
  }
}

}  // namespace

void gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt, const GemmDims& g) {
  cudaStream_t stream = ctx.stream();
  if (g.batch == 0 || g.m == 0 || g.n == 0) {  // nothing to compute (validation keeps bias_grad_out out of here)
    if (opt.d_amax_out.defined()) CUDA_CHECK(cudaMemsetAsync(opt.d_amax_out.data_ptr(), 0, sizeof(float), stream));
    return;
  }
  if (g.k == 0) {  // validated: no epilogue, non-fp8, beta 0 or 1: D = beta * D
    if (opt.beta == 0.0f) CUDA_CHECK(cudaMemsetAsync(d.data_ptr(), 0, d.nbytes(), stream));
    return;
  }
  CudaLibraries& lib = ctx.cuda_libraries();

  const bool has_bias = opt.epilogue == GemmEpilogue::Bias || opt.epilogue == GemmEpilogue::BiasGelu;
  const bool has_gelu = opt.epilogue == GemmEpilogue::Gelu || opt.epilogue == GemmEpilogue::BiasGelu;
  const bool batched = g.batch > 1;
  const int64_t es_a = int64_t(dtype_size(a.dtype())), es_b = int64_t(dtype_size(b.dtype())),
                es_d = int64_t(dtype_size(d.dtype()));
  Call c{d, a, b, opt, g};
  c.fp8 = is_fp8(a.dtype());
  c.d_fp8 = is_fp8(d.dtype());
  c.has_bias = has_bias;
  c.has_gelu = has_gelu;
  c.has_aux = has_gelu && opt.gelu_input_out.defined();
  c.has_dgelu = opt.epilogue == GemmEpilogue::DGelu;
  c.has_bgrad = opt.bias_grad_out.defined();
  c.bias_ptr = has_bias ? opt.bias.data_ptr() : (c.has_bgrad ? opt.bias_grad_out.data_ptr() : nullptr);
  c.aux_ptr = c.has_aux ? opt.gelu_input_out.data_ptr() : (c.has_dgelu ? opt.gelu_input.data_ptr() : nullptr);
  c.c_ptr = c.d_fp8 ? nullptr : d.data_ptr();
  c.align_a = alignment_of(a.data_ptr(), batched ? g.stride_a() * es_a : 0);
  c.align_b = alignment_of(b.data_ptr(), batched ? g.stride_b() * es_b : 0);
  c.align_d = alignment_of(d.data_ptr(), batched ? g.stride_d() * es_d : 0);
  c.align_c = c.d_fp8 ? 256u : c.align_d;
  c.align_bias = c.bias_ptr != nullptr ? alignment_of(c.bias_ptr, 0) : 0u;
  c.align_aux = c.aux_ptr != nullptr ? alignment_of(c.aux_ptr, batched ? g.stride_d() * es_d : 0) : 0u;

  const std::string key = c.key() + (ctx.deterministic() ? "|deterministic" : "|autotuned");
  LtPlan* plan = lib.get_plan<LtPlan>(key);
  if (plan == nullptr) {
    const bool wants_epilogue = opt.epilogue != GemmEpilogue::None || c.has_bgrad;
    // cuBLASLt's GELU aux matrix needs a leading dimension (N) and batch stride that are multiples of 8.
    const bool fusable =
        !(c.has_aux || c.has_dgelu) || (g.n % 8 == 0 && (!batched || (g.m * g.n) % 8 == 0));
    // The unfused path rounds D before the epilogue: not for fp8 D (scaled, saturated) or amax (pre-epilogue).
    const bool fallback_ok = !c.d_fp8 && !opt.d_amax_out.defined();
    std::shared_ptr<LtPlan> p;
    if (fusable && (kFuseBiasGrad || !c.has_bgrad)) p = build_plan(ctx, c, /*fused=*/true);
    if (p == nullptr && wants_epilogue && fallback_ok) p = build_plan(ctx, c, /*fused=*/false);
    if (p == nullptr)
      MEGATRON_FAIL("gemm: cuBLASLt offers no algorithm for ", c.what(),
                    fusable ? "" : " (the fused GELU aux output needs N and M*N to be multiples of 8)");
    plan = lib.put_plan(key, std::move(p));
  } else {
    set_pointers(*plan, c);
  }

  const float alpha = opt.alpha, beta = opt.beta;
  CUBLAS_CHECK_MSG(cublasLtMatmul(lib.cublaslt, plan->desc, &alpha, b.data_ptr(), plan->a, a.data_ptr(), plan->b,
                                  &beta, c.c_ptr, plan->c, d.data_ptr(), plan->d, &plan->algo,
                                  lib.cublaslt_workspace.data_ptr(), CudaLibraries::kCublasLtWorkspaceBytes, stream),
                   " (", c.what(), ")");
  if (!plan->fused) run_fallback_epilogue(ctx, c);
}

}  // namespace megatron::ops::cuda
