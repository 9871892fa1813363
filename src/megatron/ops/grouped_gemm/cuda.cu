// CUDA grouped GEMM on cuBLAS. Row-major D[M, N] = op(A) op(B) is the column-major D^T = op(B)^T op(A)^T,
// so each expert's problem is handed to cuBLAS with the operands swapped (see problem_of):
//   XWt    out_e [m_e, N] = x_e w_e^T   ->  C (N x m_e)  = w_e^T(T) * x_e(N):   m = N, n = m_e, k = K
//   XW     out_e [m_e, K] = x_e w_e     ->  C (K x m_e)  = w_e(N)   * x_e(N):   m = K, n = m_e, k = N
//   Wgrad  dw_e  [N, K]  = dy_e^T x_e   ->  C (K x N)    = x_e(N)   * dy_e(T):  m = K, n = N,  k = m_e
// (w is [E, N, K]; every leading dimension is the row length of the row-major tensor.)
//
// Grouped: one cublasGemmGroupedBatchedEx_64 call per up to kMaxGroups non-empty experts, each its own
// group of one problem. The problem sizes and scales are host arrays (read during the call); the A/B/C
// pointer arrays must be device memory: a small kernel writes them from its parameters into a stream-ordered
// scratch tensor just before the GEMM, so no host memory is handed to the device asynchronously and
// nothing waits. cuBLAS's grouped GEMM takes C in the input dtype (its documented combinations: 32F compute
// with BF16, F16 or F32 throughout), and with 16-bit inputs it needs aligned pointers (16 bytes covers every
// case). So BF16 inputs into an F32 main grad, BF16 problems with a pointer off 16 bytes (N or K not a
// multiple of 8, or a view at an odd offset), and any dtype cuBLAS declines anyway (NOT_SUPPORTED,
// remembered per combination) run per expert.
// PerExpert: one cuBLASLt matmul per non-empty expert, its algorithm chosen once per shape family (cuda_lt.cu),
// or cublasGemmEx_64 for a problem cuBLASLt declines.
// Experts without rows are skipped; in an assigning wgrad their dw_e is cleared with a memset.
//
// The cuBLAS handle lives in the context's plan cache, bound to ctx.stream() and sharing the cuBLASLt
// workspace (stream order keeps the two libraries' uses apart). Compute is fp32 (CUBLAS_COMPUTE_32F: no TF32).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/grouped_gemm/cuda.h"
#include "megatron/ops/grouped_gemm/cuda_problem.h"
#include "megatron/runtime/cuda_libraries.h"

namespace megatron::ops::cuda {
namespace {

using grouped::Problem;
using grouped::Types;

// Problems per grouped call: their pointers travel as kernel parameters (3 KiB, under the 4 KiB limit).
constexpr int kMaxGroups = 128;

struct GroupPointers {
  const void* a[kMaxGroups];
  const void* b[kMaxGroups];
  void* c[kMaxGroups];
};
static_assert(sizeof(GroupPointers) + sizeof(void*) + sizeof(int) <= 4000, "kernel parameters must stay under 4 KiB");

// out[0 .. count) = A pointers, out[count .. 2 count) = B, out[2 count .. 3 count) = C.
__global__ void write_pointers_kernel(void** __restrict__ out, GroupPointers p, int count) {
  const int i = threadIdx.x;
  if (i >= count) return;
  out[i] = const_cast<void*>(p.a[i]);
  out[count + i] = const_cast<void*>(p.b[i]);
  out[2 * count + i] = p.c[i];
}

// The context's cuBLAS handle (plan-cache entry), created on first use.
struct CublasHandle {
  cublasHandle_t handle = nullptr;
  CublasHandle() = default;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle() {
    if (handle != nullptr) cublasDestroy(handle);
  }
};

cublasHandle_t cublas_handle(Context& ctx) {
  CudaLibraries& lib = ctx.cuda_libraries();
  const std::string key = "grouped_gemm|cublas_handle";
  if (CublasHandle* h = lib.get_plan<CublasHandle>(key)) return h->handle;
  auto h = std::make_shared<CublasHandle>();
  CUBLAS_CHECK(cublasCreate(&h->handle));
  // The stream first: setting it resets the workspace to cuBLAS's default.
  CUBLAS_CHECK(cublasSetStream(h->handle, ctx.stream()));
  CUBLAS_CHECK(cublasSetWorkspace(h->handle, lib.cublaslt_workspace.data_ptr(), CudaLibraries::kCublasLtWorkspaceBytes));
  return lib.put_plan(key, std::move(h))->handle;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: MEGATRON_FAIL("grouped_gemm: dtype ", dtype_name(t), " has no cuBLAS path");
  }
}

const char* offset(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.data_ptr()) + elements * int64_t(dtype_size(t.dtype()));
}

// Expert e's problem (see the table at the top); (d, a, b) as in cuda.h.
Problem problem_of(const Tensor& d, const Tensor& a, const Tensor& b, const GroupedGemmDims& g, int64_t e) {
  const int64_t row = g.offsets[size_t(e)], rows = g.rows_of(e);
  Problem p;
  switch (g.kind) {
    case GroupedGemmKind::XWt:  // d = out [R, N], a = x [R, K], b = w
      p = {CUBLAS_OP_T, CUBLAS_OP_N, g.n, rows, g.k, g.k, g.k, g.n};
      p.a = offset(b, e * g.n * g.k), p.b = offset(a, row * g.k), p.c = const_cast<char*>(offset(d, row * g.n));
      break;
    case GroupedGemmKind::XW:  // d = out [R, K], a = x [R, N], b = w
      p = {CUBLAS_OP_N, CUBLAS_OP_N, g.k, rows, g.n, g.k, g.n, g.k};
      p.a = offset(b, e * g.n * g.k), p.b = offset(a, row * g.n), p.c = const_cast<char*>(offset(d, row * g.k));
      break;
    case GroupedGemmKind::Wgrad:  // d = dw [E, N, K], a = dy [R, N], b = x [R, K]
      p = {CUBLAS_OP_N, CUBLAS_OP_T, g.k, g.n, rows, g.k, g.n, g.k};
      p.a = offset(b, row * g.k), p.b = offset(a, row * g.n), p.c = const_cast<char*>(offset(d, e * g.n * g.k));
      p.beta = g.accumulate ? 1.0f : 0.0f;
      p.rows_in_k = true;
      break;
  }
  return p;
}

// The call's operands, for error messages (built only on failure).
struct Call {
  const Tensor& d;
  const Tensor& a;
  const Tensor& b;
  const GroupedGemmDims& g;
  std::string what() const {
    return str_cat("grouped_gemm of ", g.experts, " experts, N=", g.n, " K=", g.k, ": ", d.describe(), " from ",
                   a.describe(), " and ", b.describe());
  }
};

// Each problem on cuBLASLt (cuda_lt.cu), or with cublasGemmEx where cuBLASLt declines it.
void run_per_expert(Context& ctx, cublasHandle_t h, const std::vector<Problem>& problems, Types t, const Call& call) {
  const float alpha = 1.0f;
  for (const Problem& p : problems)
    if (!grouped::run_with_cublaslt(ctx, p, t))
      CUBLAS_CHECK_MSG(cublasGemmEx_64(h, p.ta, p.tb, p.m, p.n, p.k, &alpha, p.a, t.in, p.lda, p.b, t.in, p.ldb, &p.beta,
                                     p.c, t.out, p.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     " (", call.what(), ", m=", p.m, " n=", p.n, " k=", p.k, ")");
}

// The host arrays of one grouped call (one group of one problem per expert).
struct GroupArrays {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int64_t> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alpha, beta;
  GroupPointers pointers{};

  void add(const Problem& p) {
    const size_t i = ta.size();
    ta.push_back(p.ta), tb.push_back(p.tb), m.push_back(p.m), n.push_back(p.n), k.push_back(p.k);
    lda.push_back(p.lda), ldb.push_back(p.ldb), ldc.push_back(p.ldc), group_size.push_back(1);
    alpha.push_back(1.0f), beta.push_back(p.beta);
    pointers.a[i] = p.a, pointers.b[i] = p.b, pointers.c[i] = p.c;
  }
};

// Problems [first, first + count) in one grouped call; returns cuBLAS's status (NOT_SUPPORTED: declined).
cublasStatus_t run_group(Context& ctx, cublasHandle_t h, const std::vector<Problem>& problems, size_t first,
                         int count, Types t) {
  GroupArrays g;
  for (int i = 0; i < count; ++i) g.add(problems[first + size_t(i)]);
  Tensor pointers = ctx.empty({3 * int64_t(count)}, DType::I64);
  void** device = static_cast<void**>(pointers.data_ptr());
  write_pointers_kernel<<<1, kMaxGroups, 0, ctx.stream()>>>(device, g.pointers, count);
  CUDA_CHECK_LAUNCH("write_pointers_kernel");
  return cublasGemmGroupedBatchedEx_64(h, g.ta.data(), g.tb.data(), g.m.data(), g.n.data(), g.k.data(),
                                       g.alpha.data(), device, t.in, g.lda.data(), device + count, t.in,
                                       g.ldb.data(), g.beta.data(), device + 2 * count, t.out, g.ldc.data(), count,
                                       g.group_size.data(), CUBLAS_COMPUTE_32F);
}

// All problems in grouped calls; false when cuBLAS declined the dtypes (nothing was computed then: the
// first call checks the dtypes before launching anything).
bool run_grouped(Context& ctx, cublasHandle_t h, const std::vector<Problem>& problems, Types t, const Call& call) {
  for (size_t first = 0; first < problems.size(); first += kMaxGroups) {
    const int count = int(std::min<size_t>(kMaxGroups, problems.size() - first));
    const cublasStatus_t status = run_group(ctx, h, problems, first, count, t);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED && first == 0) return false;
    CUBLAS_CHECK_MSG(status, " (cublasGemmGroupedBatchedEx_64 for ", call.what(), ", ", count, " experts)");
  }
  return true;
}

// Whether the grouped launch may take these problems: C in the input dtype, and for 16-bit inputs every
// pointer 16-byte aligned.
bool groupable(const std::vector<Problem>& problems, Types t) {
  if (t.in != t.out) return false;
  if (t.in == CUDA_R_32F) return true;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return std::all_of(problems.begin(), problems.end(),
                     [&](const Problem& p) { return aligned(p.a) && aligned(p.b) && aligned(p.c); });
}

// Clears dw_e of the experts without rows (an assigning wgrad), merging runs of consecutive experts.
void clear_empty_experts(Context& ctx, const Tensor& dw, const GroupedGemmDims& g) {
  const int64_t bytes = g.n * g.k * int64_t(dtype_size(dw.dtype()));
  for (int64_t e = 0; e < g.experts;) {
    if (g.rows_of(e) != 0) {
      ++e;
      continue;
    }
    int64_t end = e;
    while (end < g.experts && g.rows_of(end) == 0) ++end;
    CUDA_CHECK(cudaMemsetAsync(const_cast<char*>(offset(dw, e * g.n * g.k)), 0, size_t((end - e) * bytes),
                               ctx.stream()));
    e = end;
  }
}

}  // namespace

void grouped_gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GroupedGemmDims& g,
                  GroupedGemmAlgo algo) {
  if (g.kind == GroupedGemmKind::Wgrad && !g.accumulate && g.n * g.k > 0) clear_empty_experts(ctx, d, g);
  std::vector<Problem> problems;
  for (int64_t e = 0; e < g.experts; ++e)
    if (g.rows_of(e) > 0) problems.push_back(problem_of(d, a, b, g, e));
  if (problems.empty() || problems.front().m == 0 || problems.front().n == 0) return;  // no rows, or empty outputs
  if (problems.front().k == 0) {  // XWt / XW with an empty inner dimension: the products are 0
    CUDA_CHECK(cudaMemsetAsync(d.data_ptr(), 0, size_t(g.offsets.back() * d.dim(1)) * dtype_size(d.dtype()),
                               ctx.stream()));
    return;
  }
  const Types t{cuda_type(a.dtype()), cuda_type(d.dtype())};
  const Call call{d, a, b, g};
  cublasHandle_t h = cublas_handle(ctx);
  CudaLibraries& lib = ctx.cuda_libraries();
  const std::string declined = str_cat("grouped_gemm|declined|", int(t.in), "|", int(t.out));
  const bool grouped =
      algo == GroupedGemmAlgo::Grouped && groupable(problems, t) && lib.get_plan<int>(declined) == nullptr;
  if (grouped && run_grouped(ctx, h, problems, t, call)) return;
  if (grouped) lib.put_plan(declined, std::make_shared<int>(1));
  run_per_expert(ctx, h, problems, t, call);
}

}  // namespace megatron::ops::cuda
