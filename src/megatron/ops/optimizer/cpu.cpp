// CPU kernels of the optimizer family: each tensor's elements in parallel blocks, double arithmetic per
// element (as the sequential reference). The norm's sum of squares keeps one partial per block, added in
// block order, and tensors are added in list order: the same bits for every thread count.
#include "megatron/ops/optimizer/cpu.h"

#include <cmath>
#include <type_traits>

#include "megatron/ops/cpu_parallel.h"

namespace megatron::ops::cpu {
namespace {

// Calls fn.template operator()<TO>() with model_param's storage type, or with void when it is undefined.
template <class Fn>
void visit_optional(const Tensor& t, const char* op, Fn&& fn) {
  if (!t.defined()) return fn.template operator()<void>();
  visit_float_dtype(t.dtype(), op, [&]<class T>() { fn.template operator()<T>(); });
}

struct AdamWScalars {
  double lr, wd, beta1, beta2, eps, bias1, bias2, grad_scale;
};

// Elements [begin, end) of one tensor's update. The pointers are distinct tensors and the scalars are locals, so
// the loop is a plain elementwise loop the compiler vectorises -- the same IEEE operations per element in the same
// order (no FMA contraction: AVX2 alone does not enable it), so vectorising changes no bit; it only lets the host
// update of --optimizer-cpu-offload keep up with the GPU. With GCC an AVX2 clone is picked at load time where the CPU
// has it (clang does not clone function templates: it builds the baseline only).
#if defined(__GNUC__) && !defined(__clang__)
#define MEGATRON_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define MEGATRON_AVX2_CLONE
#endif
template <class TP, class TG, class TO>
MEGATRON_AVX2_CLONE void adamw_block(TP* __restrict p, TP* __restrict m,
                                                                   TP* __restrict v, const TG* __restrict g,
                                                                   void* model_param, int64_t begin, int64_t end,
                                                                   AdamWScalars s) {
  [[maybe_unused]] auto* __restrict out = static_cast<std::conditional_t<std::is_void_v<TO>, char, TO>*>(model_param);
  const double lr = s.lr, wd = s.wd, beta1 = s.beta1, beta2 = s.beta2, eps = s.eps, bias1 = s.bias1,
               bias2 = s.bias2, grad_scale = s.grad_scale;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    double gi = to_double(g[i]) * grad_scale;
    double pi = to_double(p[i]);
    pi -= lr * wd * pi;
    double mi = beta1 * to_double(m[i]) + (1 - beta1) * gi;
    double vi = beta2 * to_double(v[i]) + (1 - beta2) * gi * gi;
    pi -= lr * (mi / bias1) / (std::sqrt(vi / bias2) + eps);
    p[i] = from_double<TP>(pi);
    m[i] = from_double<TP>(mi);
    v[i] = from_double<TP>(vi);
    if constexpr (!std::is_void_v<TO>) out[i] = from_double<TO>(to_double(p[i]));
  }
}

template <class TP, class TG, class TO>
void adamw_elements(TP* p, TP* m, TP* v, const TG* g, void* model_param, int64_t n, AdamWScalars s) {
  parallel_for(n, kStreamBlock, [=](int64_t begin, int64_t end) {
    adamw_block<TP, TG, TO>(p, m, v, g, model_param, begin, end, s);
  });
}

}  // namespace

void adamw_step(const std::vector<AdamParamGroupTensors>& tensors, const AdamWConfig& config) {
  const double lr = config.lr, beta1 = config.beta1, beta2 = config.beta2, eps = config.eps;
  const double grad_scale = config.grad_scale;
  const double bias1 = 1 - std::pow(beta1, double(config.step));
  const double bias2 = 1 - std::pow(beta2, double(config.step));
  for (const AdamParamGroupTensors& e : tensors) {
    const double wd = e.weight_decay.value_or(config.weight_decay);
    const int64_t n = e.param.numel();
    visit_float_dtype(e.param.dtype(), "adamw_step", [&]<class TP>() {
      visit_float_dtype(e.grad.dtype(), "adamw_step", [&]<class TG>() {
        visit_optional(e.model_param, "adamw_step", [&]<class TO>() {
          adamw_elements<TP, TG, TO>(static_cast<TP*>(e.param.data_ptr()), static_cast<TP*>(e.exp_avg.data_ptr()),
                                     static_cast<TP*>(e.exp_avg_sq.data_ptr()),
                                     static_cast<const TG*>(e.grad.data_ptr()), e.model_param.defined() ?
                                     e.model_param.data_ptr() : nullptr, n, AdamWScalars{lr, wd, beta1, beta2, eps,
                                     bias1, bias2, grad_scale});
        });
      });
    });
  }
}

void multi_tensor_l2_norm(const Tensor& out, const Tensor& per_tensor_out, const std::vector<Tensor>& tensors) {
  double total = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    double sum = 0;
    visit_float_dtype(tensors[k].dtype(), "multi_tensor_l2_norm", [&]<class T>() {
      const T* x = static_cast<const T*>(tensors[k].data_ptr());
      const std::vector<double> partial =
          parallel_partials<double>(tensors[k].numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
            double s = 0;
            for (int64_t i = begin; i < end; ++i) s += to_double(x[i]) * to_double(x[i]);
            return s;
          });
      for (double part : partial) sum += part;
    });
    total += sum;
    if (per_tensor_out.defined())
      visit_float_dtype(per_tensor_out.dtype(), "multi_tensor_l2_norm",
                        [&]<class T>() { static_cast<T*>(per_tensor_out.data_ptr())[k] = from_double<T>(std::sqrt(sum)); });
  }
  visit_float_dtype(out.dtype(), "multi_tensor_l2_norm",
                    [&]<class T>() { static_cast<T*>(out.data_ptr())[0] = from_double<T>(std::sqrt(total)); });
}

void multi_tensor_count_zeros(const Tensor& out, const std::vector<Tensor>& tensors) {
  int64_t zeros = 0;
  for (const Tensor& t : tensors)
    visit_float_dtype(t.dtype(), "multi_tensor_count_zeros", [&]<class T>() {
      const T* x = static_cast<const T*>(t.data_ptr());
      for (int64_t part : parallel_partials<int64_t>(t.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
             int64_t n = 0;
             for (int64_t i = begin; i < end; ++i) n += to_double(x[i]) == 0.0;
             return n;
           }))
        zeros += part;
    });
  out.data<int64_t>()[0] = zeros;
}

void multi_tensor_scale(const std::vector<Tensor>& outs, const Tensor& found_inf, const std::vector<Tensor>& ins,
                        float scale) {
  bool bad = false;
  for (size_t k = 0; k < ins.size(); ++k) {
    visit_float_dtype(ins[k].dtype(), "multi_tensor_scale", [&]<class TI>() {
      visit_float_dtype(outs[k].dtype(), "multi_tensor_scale", [&]<class TO>() {
        const TI* x = static_cast<const TI*>(ins[k].data_ptr());
        TO* y = static_cast<TO*>(outs[k].data_ptr());
        const std::vector<int> block_bad =
            parallel_partials<int>(ins[k].numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
              int any = 0;
              for (int64_t i = begin; i < end; ++i) {
                TO r;
                if constexpr (std::is_same_v<TI, double> || std::is_same_v<TO, double>) {
                  r = from_double<TO>(to_double(x[i]) * double(scale));
                } else {
                  r = from_float<TO>(to_float(x[i]) * scale);  // the fp32 product, as on the GPU
                }
                any |= !std::isfinite(to_double(r));
                y[i] = r;
              }
              return any;
            });
        for (int b : block_bad) bad |= b != 0;
      });
    });
  }
  if (bad && found_inf.defined()) {
    if (found_inf.dtype() == DType::F32) found_inf.data<float>()[0] = 1.f;
    else found_inf.data<int32_t>()[0] = 1;
  }
}

}  // namespace megatron::ops::cpu
