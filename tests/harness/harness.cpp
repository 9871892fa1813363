#include "harness.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <unistd.h>
#include <limits>
#include <memory>

#include "megatron/core/philox.h"
#include "megatron/runtime/cpu_threads.h"

#if MEGATRON_WITH_CUDA
#include <cuda_runtime.h>

#include "megatron/core/cuda_check.h"
#endif

namespace megatron::testing {

double default_max_nmse(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-20;
    case DType::F32: return 1e-10;
    case DType::F16: return 1e-6;
    case DType::BF16: return 1e-4;
    case DType::F8E4M3: return 4e-3;
    case DType::F8E5M2: return 1.5e-2;
    default: return 0.0;  // integers: exact
  }
}

double nmse(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ref_finite = std::isfinite(ref[i]);
    if (!ref_finite) {
      // Non-finite reference values must be matched exactly (same NaN-ness / same infinity).
      bool same = (std::isnan(ref[i]) && std::isnan(got[i])) || ref[i] == got[i];
      if (!same) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return num / den;
}

uint64_t seed_from(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void fill_random(const Tensor& t, uint64_t seed, double lo, double hi) {
  MEGATRON_CHECK(t.device().is_cpu(), "fill_random needs a CPU tensor, got ", t.describe());
  visit_dtype(t.dtype(), [&]<class T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) {
      double u = philox_uniform(seed, 0, uint64_t(i));
      double v = lo + (hi - lo) * u;
      if constexpr (std::is_integral_v<T>) p[i] = T(std::floor(v));
      else p[i] = from_double<T>(v);
    }
  });
}

void fill_normal(const Tensor& t, uint64_t seed, double scale) {
  MEGATRON_CHECK(t.device().is_cpu(), "fill_normal needs a CPU tensor, got ", t.describe());
  visit_float_dtype(t.dtype(), "fill_normal", [&]<class T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = from_double<T>(scale * philox_normal(seed, 1, uint64_t(i)));
  });
}

Tensor copy_on(Context& ctx, const Tensor& host, bool unaligned) {
  const int64_t n = host.numel(), skip = unaligned ? 1 : 0;
  Tensor t = ctx.empty(Shape{n + skip}, host.dtype()).slice(skip, n + skip).view(host.shape().dims());
  copy_tensor(ctx, t, host);
  return t;
}

void poison(Context& ctx, const Tensor& t) {
  if (t.nbytes() == 0) return;
  if (t.device().is_cpu()) {
    std::memset(t.data_ptr(), 0xFF, t.nbytes());
    return;
  }
#if MEGATRON_WITH_CUDA
  CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0xFF, t.nbytes(), ctx.stream()));
#endif
}

std::vector<double> to_doubles(Context& ctx, const Tensor& t) {
  Tensor host = t;
  if (!t.device().is_cpu()) host = to_device(ctx, t, Device::cpu(), cpu_context().allocator());
  std::vector<double> out(size_t(t.numel()));
  visit_dtype(t.dtype(), [&]<class T>() {
    const T* p = static_cast<const T*>(host.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = to_double(p[i]);
  });
  return out;
}

Context& cpu_context() {
  static std::unique_ptr<Context> ctx = Context::cpu();
  return *ctx;
}

bool have_gpu() { return cuda_backend_compiled() && cuda_device_count() > 0; }

Context& cuda_context() {
  static std::unique_ptr<Context> ctx = Context::cuda(0);
  return *ctx;
}

std::string gtest_name(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected megatron::Error, nothing was thrown";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
  }
}

void run_python(const std::filesystem::path& dir, const std::string& script, const std::string& args) {
  const std::filesystem::path path = dir / "script.py";
  std::ofstream(path) << script;
  const std::string command = "python3 " + path.string() + " " + args + " 2>&1";
  const int rc = std::system(command.c_str());
  ASSERT_EQ(rc, 0) << "python3 failed (python3 and the reference packages are required; scripts/deps.sh installs "
                      "them): "
                   << command;
}

namespace {

struct CaseTensors {
  std::vector<Tensor> inputs, outputs;
};

// Random CPU inputs for a case (the same on every call for the same case).
std::vector<Tensor> make_cpu_inputs(const std::string& name, const std::vector<TensorSpec>& specs) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor t = cpu_context().empty(specs[i].shape, specs[i].dtype);
    fill_random(t, seed_from(name + "#" + std::to_string(i)), specs[i].lo, specs[i].hi);
    in.push_back(t);
  }
  return in;
}

CaseTensors run_on(Context& ctx, const OpCase& c, const std::vector<Tensor>& cpu_inputs) {
  CaseTensors r;
  for (const Tensor& t : cpu_inputs)
    r.inputs.push_back(ctx.is_cuda() ? to_device(ctx, t, ctx.device(), cpu_context().allocator()) : t);
  for (const TensorSpec& s : c.outputs) {
    Tensor t = ctx.empty(s.shape, s.dtype);
    poison(ctx, t);
    r.outputs.push_back(t);
  }
  for (auto [out_index, in_index] : c.output_starts_as_input) copy_tensor(ctx, r.outputs[out_index], r.inputs[in_index]);
  c.run(ctx, r.inputs, r.outputs);
  ctx.synchronize();
  return r;
}

}  // namespace

void expect_cuda_matches_cpu(const OpCase& c) {
  std::vector<Tensor> cpu_inputs = make_cpu_inputs(c.name, c.inputs);
  CaseTensors ref = run_on(cpu_context(), c, cpu_inputs);
  CaseTensors got = run_on(cuda_context(), c, cpu_inputs);
  for (size_t k = 0; k < c.outputs.size(); ++k) {
    std::vector<double> g = to_doubles(cuda_context(), got.outputs[k]);
    std::vector<double> r = to_doubles(cpu_context(), ref.outputs[k]);
    double limit = (k < c.max_nmse.size() && c.max_nmse[k] > 0) ? c.max_nmse[k] : default_max_nmse(c.outputs[k].dtype);
    double e = nmse(g, r);
    EXPECT_LE(e, limit) << c.name << ": output " << k << " (" << got.outputs[k].describe()
                        << ") differs from the CPU reference: nmse " << e << " > " << limit;
    if (limit == 0 && e > 0) {
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] != r[i]) {
          ADD_FAILURE() << "first mismatch at element " << i << ": cuda " << g[i] << " cpu " << r[i];
          break;
        }
    }
  }
}

ScopedCpuThreads::ScopedCpuThreads(int n) : saved_(cpu_threads()) { set_cpu_threads(n); }
ScopedCpuThreads::~ScopedCpuThreads() { set_cpu_threads(saved_); }

void expect_cpu_writes_every_output(const OpCase& c) {
  std::vector<Tensor> cpu_inputs = make_cpu_inputs(c.name, c.inputs);
  // One run per thread count: every output must be written, and the kernels' results must not depend on
  // how many threads split the work (cpu_parallel.h), bit for bit.
  std::vector<CaseTensors> runs;
  for (int threads : kThreadCounts) {
    ScopedCpuThreads scope(threads);
    runs.push_back(run_on(cpu_context(), c, cpu_inputs));
  }
  for (size_t k = 0; k < c.outputs.size(); ++k) {
    std::vector<double> va = to_doubles(cpu_context(), runs[0].outputs[k]);
    size_t nan_count = 0;
    for (double v : va) nan_count += std::isnan(v);
    EXPECT_EQ(nan_count, 0u) << c.name << ": output " << k << " has " << nan_count << " unwritten (NaN) elements";
    for (size_t r = 1; r < runs.size(); ++r)
      EXPECT_EQ(std::memcmp(runs[0].outputs[k].data_ptr(), runs[r].outputs[k].data_ptr(), runs[0].outputs[k].nbytes()),
                0)
          << c.name << ": output " << k << " differs between the CPU runs with " << kThreadCounts[0] << " and "
          << kThreadCounts[r] << " threads";
  }
}

void expect_gradients_match_finite_differences(const GradCase& c) {
  Context& ctx = cpu_context();
  std::vector<TensorSpec> specs = c.inputs;
  for (auto& s : specs) s.dtype = DType::F64;
  std::vector<Tensor> in = make_cpu_inputs(c.name, specs);

  std::vector<Tensor> out = c.forward(ctx, in);
  std::vector<Tensor> cot;
  for (size_t k = 0; k < out.size(); ++k) {
    Tensor g = ctx.empty(out[k].shape(), DType::F64);
    fill_random(g, seed_from(c.name + "#cotangent" + std::to_string(k)));
    cot.push_back(g);
  }
  auto loss = [&]() {
    std::vector<Tensor> o = c.forward(ctx, in);
    double l = 0;
    for (size_t k = 0; k < o.size(); ++k) {
      const double* po = o[k].data<double>();
      const double* pg = cot[k].data<double>();
      for (int64_t i = 0; i < o[k].numel(); ++i) l += po[i] * pg[i];
    }
    return l;
  };
  std::vector<Tensor> grads = c.backward(ctx, in, cot);
  ASSERT_EQ(grads.size(), c.differentiable.size()) << c.name << ": backward returned the wrong number of gradients";
  for (size_t j = 0; j < c.differentiable.size(); ++j) {
    Tensor x = in[c.differentiable[j]];
    ASSERT_EQ(grads[j].shape(), x.shape()) << c.name << ": gradient " << j << " has the wrong shape";
    double* px = x.data<double>();
    const double* pg = grads[j].data<double>();
    int64_t n = x.numel();
    int64_t stride = std::max<int64_t>(1, n / c.max_elements_per_input);
    double num = 0, den = 0, worst = 0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < n; i += stride) {
      double saved = px[i];
      double h = c.step * std::max(1.0, std::abs(saved));
      px[i] = saved + h;
      double lp = loss();
      px[i] = saved - h;
      double lm = loss();
      px[i] = saved;
      double fd = (lp - lm) / (2 * h);
      double d = pg[i] - fd;
      num += d * d;
      den += fd * fd;
      if (std::abs(d) > worst) {
        worst = std::abs(d);
        worst_i = i;
      }
    }
    double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    EXPECT_LE(rel, c.max_rel_error) << c.name << ": gradient of input " << c.differentiable[j]
                                    << " vs finite differences: relative error " << rel << " (worst element "
                                    << worst_i << ", |diff| " << worst << ")";
  }
}

}  // namespace megatron::testing
