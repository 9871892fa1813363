// One expert's GEMM on cuBLASLt with an algorithm chosen once per shape family (cuda_problem.h).
//
// Why not cublasGemmEx: its default algorithm choice is poor for the expert shapes. On an H200, the weight
// gradients of a Mixtral-style layer (8 experts x 2048 rows, bf16 into the fp32 main grad) run at 1.33 ms
// (fc1) and 0.81 ms (fc2) with cublasGemmEx, at 1.14 and 0.60 ms with the fastest of cuBLASLt's heuristic
// candidates -- against 0.99 and 0.53 ms for one dense GEMM of the same FLOPs.
//
// Why families: an expert's row count changes with every routing, so a plan per exact shape would time
// candidates again at nearly every call. A family is the shape with the expert's row count (n, or k for a
// weight gradient: always a column count of the layouts, so any value is a valid layout) rounded up to a power
// of two, plus everything else that decides which kernels apply (transposes, the other dimensions, leading
// dimensions, dtypes, whether C is read, the pointers' alignment). The heuristic is asked about the family's
// shape, so its candidates -- and in deterministic mode its first choice, which is then taken untimed -- depend
// on the family alone (a resumed run picks what the uninterrupted run picked). Otherwise the fastest of up to 8
// candidates is kept, timed on the family's first problem with that problem's own operands (an accumulating
// problem writes into a scratch C, so no gradient is disturbed). The layouts are reset to each problem's
// exact dimensions before its launch; an algorithm cuBLASLt refuses for a particular problem launches nothing
// and the caller runs that problem with cublasGemmEx.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <memory>
#include <string>

#include "megatron/core/cuda_check.h"
#include "megatron/ops/gemm/fastest_launch.h"
#include "megatron/ops/grouped_gemm/cuda_problem.h"
#include "megatron/runtime/cuda_libraries.h"

namespace megatron::ops::cuda::grouped {
namespace {

constexpr int kCandidates = 8;

// The descriptors of one shape family and its algorithm (plan-cache entry).
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;  // false: cuBLASLt offers nothing for the family (every problem falls back)

  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return address == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, address & (~address + 1)));
}

// p with its expert row count rounded up to a power of two.
Problem family_of(const Problem& p) {
  Problem f = p;
  int64_t& rows = p.rows_in_k ? f.k : f.n;
  rows = int64_t(std::bit_ceil(uint64_t(rows)));
  return f;
}

std::string family_key(const Problem& f, Types t, bool deterministic) {
  return str_cat("grouped_gemm|lt|", int(f.ta), int(f.tb), "|", f.m, "x", f.n, "x", f.k, "|ld ", f.lda, ",", f.ldb,
                 ",", f.ldc, "|", int(t.in), ">", int(t.out), f.beta != 0.0f ? "|reads C" : "", "|align ",
                 alignment_of(f.a), ",", alignment_of(f.b), ",", alignment_of(f.c),
                 deterministic ? "|deterministic" : "|autotuned");
}

void set_dims(cublasLtMatrixLayout_t layout, int64_t rows, int64_t cols) {
  const uint64_t r = uint64_t(rows), c = uint64_t(cols);
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
}

// The plan's layouts take p's exact dimensions.
void fit_layouts(LtPlan& plan, const Problem& p) {
  if (p.ta == CUBLAS_OP_N) set_dims(plan.a, p.m, p.k);
  else set_dims(plan.a, p.k, p.m);
  if (p.tb == CUBLAS_OP_N) set_dims(plan.b, p.k, p.n);
  else set_dims(plan.b, p.n, p.k);
  set_dims(plan.c, p.m, p.n);
}

cublasStatus_t launch(Context& ctx, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo, const Problem& p,
                      void* c) {
  CudaLibraries& lib = ctx.cuda_libraries();
  const float alpha = 1.0f;
  return cublasLtMatmul(lib.cublaslt, plan.desc, &alpha, p.a, plan.a, p.b, plan.b, &p.beta, c, plan.c, c, plan.c,
                        &algo, lib.cublaslt_workspace.data_ptr(), CudaLibraries::kCublasLtWorkspaceBytes,
                        ctx.stream());
}

// The index of the fastest candidate on p (run into a scratch C when p reads C); -1 when none runs.
int fastest(Context& ctx, const LtPlan& plan, const Problem& p, Types t,
            const cublasLtMatmulHeuristicResult_t* results, int count) {
  cudaStream_t stream = ctx.stream();
  Tensor scratch;
  void* c = p.c;
  if (p.beta != 0.0f) {
    const DType out = t.out == CUDA_R_32F ? DType::F32 : DType::BF16;
    scratch = ctx.empty({p.ldc * p.n}, out);
    CUDA_CHECK(cudaMemsetAsync(scratch.data_ptr(), 0, scratch.nbytes(), stream));
    c = scratch.data_ptr();
  }
  return fastest_launch(stream, count, [&](int i) { return launch(ctx, plan, results[i].algo, p, c); });
}

// The family's plan: heuristic candidates for the family's shape, the fastest on p (p's family's first problem).
std::shared_ptr<LtPlan> build_plan(Context& ctx, const Problem& p, Types t) {
  CudaLibraries& lib = ctx.cuda_libraries();
  auto plan = std::make_shared<LtPlan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof(p.ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof(p.tb)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, t.in, 1, 1, uint64_t(p.lda)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, t.in, 1, 1, uint64_t(p.ldb)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, t.out, 1, 1, uint64_t(p.ldc)));
  fit_layouts(*plan, family_of(p));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)> guard(
      pref, &cublasLtMatmulPreferenceDestroy);
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(CudaLibraries::kCublasLtWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(p.a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(p.b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(p.c));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(p.c));

  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  const int wanted = ctx.deterministic() ? 1 : kCandidates;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lib.cublaslt, plan->desc, plan->a, plan->b, plan->c,
                                                               plan->c, pref, wanted, results, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return plan;  // no algorithm: the family falls back
  fit_layouts(*plan, p);
  const int best = found > 1 ? fastest(ctx, *plan, p, t, results, found) : 0;
  if (best >= 0) plan->algo = results[best].algo, plan->has_algo = true;
  return plan;
}

}  // namespace

bool run_with_cublaslt(Context& ctx, const Problem& p, Types t) {
  CudaLibraries& lib = ctx.cuda_libraries();
  const std::string key = family_key(family_of(p), t, ctx.deterministic());
  LtPlan* plan = lib.get_plan<LtPlan>(key);
  if (plan == nullptr) plan = lib.put_plan(key, build_plan(ctx, p, t));
  if (!plan->has_algo) return false;
  fit_layouts(*plan, p);
  const cublasStatus_t status = launch(ctx, *plan, plan->algo, p, p.c);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;  // declined
  CUBLAS_CHECK_MSG(status, " (cublasLtMatmul of an expert GEMM: m=", p.m, " n=", p.n, " k=", p.k, ")");
  return true;
}

}  // namespace megatron::ops::cuda::grouped
