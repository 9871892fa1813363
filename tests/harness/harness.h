// The op test harness: one table of cases per op family, each run on CUDA and on the CPU reference and
// compared; plus finite-difference gradient checks of backward ops in fp64 on the CPU.
//
// Rules it enforces (see docs/testing.md):
// - inputs are random (Philox, seeded from the case name), never zeros;
// - every output is poisoned (all bytes 0xFF: NaN in every float format) before each run, so an element
//   the kernel forgot to write fails the comparison;
// - error is the normalised squared error  sum((got-ref)^2) / sum(ref^2)  against a threshold per dtype;
//   integer outputs must match exactly.
// Test suites whose name contains "Gpu" need a GPU: ctest labels them `gpu` and CI skips them.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "megatron/runtime/context.h"
#include "temp_dirs.h"

namespace megatron::testing {

struct TensorSpec {
  Shape shape;
  DType dtype = DType::F32;
  double lo = -1.0;  // uniform range of random values (integers: [lo, hi) rounded down)
  double hi = 1.0;
};

struct OpCase {
  std::string name;                  // unique; letters, digits and '_' are kept in the gtest name
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;   // allocated and poisoned by the harness
  // Runs the op on ctx (either device): reads `in`, writes `out`.
  std::function<void(Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& out)> run;
  // Per-output threshold on the normalised squared error; 0 or missing = default_max_nmse(dtype).
  std::vector<double> max_nmse;
  // Outputs that accumulate into existing values: (output index, input index) pairs copied before the run
  // instead of poisoning.
  std::vector<std::pair<int, int>> output_starts_as_input;
};

double default_max_nmse(DType dtype);
// sum((got-ref)^2)/sum(ref^2); +inf when `got` holds a NaN or inf that `ref` does not.
double nmse(const std::vector<double>& got, const std::vector<double>& ref);

// Fills a CPU tensor with uniform values in [lo, hi) from Philox(seed).
void fill_random(const Tensor& cpu_tensor, uint64_t seed, double lo = -1.0, double hi = 1.0);
// Fills a CPU tensor with standard normals * scale.
void fill_normal(const Tensor& cpu_tensor, uint64_t seed, double scale = 1.0);
// Sets every byte to 0xFF (NaN for every float format) on any device.
void poison(Context& ctx, const Tensor& t);
// Copies to the host and widens every element to double.
std::vector<double> to_doubles(Context& ctx, const Tensor& t);
// A copy of `host` on ctx, of host's shape; `unaligned`: a view one element into a larger buffer, so that its
// address defeats a kernel's vector loads.
Tensor copy_on(Context& ctx, const Tensor& host, bool unaligned = false);
// A seed derived from a string (stable across runs and machines).
uint64_t seed_from(const std::string& s);

// Shared contexts for tests (created on first use).
Context& cpu_context();
Context& cuda_context();  // GTEST_SKIP is the caller's job: use MEGATRON_REQUIRE_GPU() first
bool have_gpu();

// Runs `c` on CUDA and on the CPU and compares every output (gtest assertions).
void expect_cuda_matches_cpu(const OpCase& c);
// The thread counts the CPU checks run at (the first is the reference the others must equal bit for bit).
inline constexpr int kThreadCounts[] = {1, 2, 4};

// Sets the CPU thread count (runtime/cpu_threads.h) for a scope and restores the previous one.
class ScopedCpuThreads {
 public:
  explicit ScopedCpuThreads(int n);
  ~ScopedCpuThreads();
  ScopedCpuThreads(const ScopedCpuThreads&) = delete;
  ScopedCpuThreads& operator=(const ScopedCpuThreads&) = delete;

 private:
  int saved_;
};

// Runs `c` on the CPU once per count in kThreadCounts, poisoned, and checks that every output element was
// written (no NaN left) and that the runs agree bit for bit (determinism of the reference, whatever the
// thread count).
void expect_cpu_writes_every_output(const OpCase& c);

// ---- finite differences (fp64, CPU) ----
struct GradCase {
  std::string name;
  std::vector<TensorSpec> inputs;       // dtype is forced to F64
  std::vector<int> differentiable;      // indices into inputs whose gradients backward returns, in order
  // forward(in) -> outputs (F64 CPU tensors)
  std::function<std::vector<Tensor>(Context& ctx, const std::vector<Tensor>& in)> forward;
  // backward(in, grad_outputs) -> one gradient per entry of `differentiable`
  std::function<std::vector<Tensor>(Context& ctx, const std::vector<Tensor>& in, const std::vector<Tensor>& grad_out)>
      backward;
  double step = 1e-6;
  double max_rel_error = 1e-6;          // ||analytic - numeric|| / ||numeric||
  int max_elements_per_input = 4096;    // larger inputs are checked on a deterministic subset
};
// With a random cotangent G per output, L(x) = sum_k <forward(x)_k, G_k>; checks backward's gradients
// against central differences of L.
void expect_gradients_match_finite_differences(const GradCase& c);

std::string gtest_name(const std::string& s);

// Runs fn() and expects a megatron::Error whose message contains every one of `parts` (the op's name, the
// argument, the shapes): error messages are part of the contract.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts);

// Writes `script` to dir/script.py and runs `python3 dir/script.py args`; a non-zero exit (python3 or a
// package missing, or the reference failing) fails the test: references are never silently skipped.
void run_python(const std::filesystem::path& dir, const std::string& script, const std::string& args);

// gtest prints parameters of failing tests; show the case name instead of raw bytes.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

}  // namespace megatron::testing

#define MEGATRON_REQUIRE_GPU() \
  do {                                                                                  \
    if (!::megatron::testing::have_gpu()) GTEST_SKIP() << "no CUDA device / CUDA backend"; \
  } while (0)

// Registers the cases returned by `cases_fn()` (a std::vector<OpCase>) as two parameterised tests:
//   <Suite>Gpu.CudaMatchesCpu/<case>  (label gpu)   and   <Suite>Cpu.CpuWritesEveryOutput/<case>.
#define MEGATRON_OP_CASES(Suite, cases_fn)                                                                 \
  class Suite##Gpu : public ::testing::TestWithParam<::megatron::testing::OpCase> {};                     \
  TEST_P(Suite##Gpu, CudaMatchesCpu) {                                                                    \
    MEGATRON_REQUIRE_GPU();                                                                               \
    ::megatron::testing::expect_cuda_matches_cpu(GetParam());                                             \
  }                                                                                                       \
  INSTANTIATE_TEST_SUITE_P(Ops, Suite##Gpu, ::testing::ValuesIn(cases_fn()),                              \
                           [](const auto& info) { return ::megatron::testing::gtest_name(info.param.name); }); \
  class Suite##Cpu : public ::testing::TestWithParam<::megatron::testing::OpCase> {};                     \
  TEST_P(Suite##Cpu, CpuWritesEveryOutput) { ::megatron::testing::expect_cpu_writes_every_output(GetParam()); } \
  INSTANTIATE_TEST_SUITE_P(Ops, Suite##Cpu, ::testing::ValuesIn(cases_fn()),                              \
                           [](const auto& info) { return ::megatron::testing::gtest_name(info.param.name); })

// Registers GradCases as <Suite>Grad.MatchesFiniteDifferences/<case> (CPU).
#define MEGATRON_GRAD_CASES(Suite, cases_fn)                                                              \
  class Suite##Grad : public ::testing::TestWithParam<::megatron::testing::GradCase> {};                 \
  TEST_P(Suite##Grad, MatchesFiniteDifferences) {                                                        \
    ::megatron::testing::expect_gradients_match_finite_differences(GetParam());                          \
  }                                                                                                      \
  INSTANTIATE_TEST_SUITE_P(Ops, Suite##Grad, ::testing::ValuesIn(cases_fn()),                            \
                           [](const auto& info) { return ::megatron::testing::gtest_name(info.param.name); })
