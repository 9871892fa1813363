#include "megatron/ops/cross_entropy/cpu.h"

#include <cmath>
#include <algorithm>
#include <limits>
#include <vector>

namespace megatron::ops::cpu {
namespace {

// Target of row t, validated against the vocabulary size.
int64_t target_at(const Tensor& targets, int64_t t, int64_t vocab, const char* op) {
  int64_t v = targets.dtype() == DType::I32 ? int64_t(targets.data<int32_t>()[t]) : targets.data<int64_t>()[t];
  MEGATRON_CHECK(v >= 0 && v < vocab, op, ": targets[", t, "] = ", v, " is outside the vocabulary [0, ", vocab,
                 ") (there is no ignore index; mask tokens with loss_mask)");
  return v;
}

double row_lse(const double* row, int64_t vocab) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < vocab; ++v) m = std::max(m, row[v]);
  if (std::isinf(m) && m < 0) return m;
  double s = 0;
  for (int64_t v = 0; v < vocab; ++v) s += std::exp(row[v] - m);
  return m + std::log(s);
}

// Reads `t` (any float dtype) as doubles.
std::vector<double> widen(const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  visit_float_dtype(t.dtype(), "cross_entropy", [&]<class T>() {
    const T* p = static_cast<const T*>(t.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = to_double(p[i]);
  });
  return out;
}

void store(const Tensor& t, int64_t i, double value) {
  visit_float_dtype(t.dtype(), "cross_entropy", [&]<class T>() { static_cast<T*>(t.data_ptr())[i] = from_double<T>(value); });
}

double mask_at(const Tensor& loss_mask, int64_t t) { return loss_mask.defined() ? double(loss_mask.data<float>()[t]) : 1.0; }

}  // namespace

void cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits, const Tensor& targets) {
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  std::vector<double> x = widen(logits);
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t target = target_at(targets, t, vocab, "cross_entropy_forward");
    const double* row = x.data() + t * vocab;
    double l = row_lse(row, vocab);
    store(lse, t, l);
    store(losses, t, l - row[target]);
  }
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& dlosses, const Tensor& logits,
                            const Tensor& targets, const Tensor& lse) {
  vocab_parallel_cross_entropy_backward(dlogits, dlosses, logits, targets, lse, 0, logits.dim(1));
}

void vocab_parallel_cross_entropy_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                        int64_t vocab_start, int64_t global_vocab) {
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  std::vector<double> x = widen(logits);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t target = target_at(targets, t, global_vocab, "vocab_parallel_cross_entropy_stats") - vocab_start;
    const double* row = x.data() + t * vocab;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < vocab; ++v) m = std::max(m, row[v]);
    double s = 0;
    if (!(std::isinf(m) && m < 0))
      for (int64_t v = 0; v < vocab; ++v) s += std::exp(row[v] - m);
    store(stats, t, m);
    store(stats, tokens + t, s);
    store(stats, 2 * tokens + t, (target >= 0 && target < vocab) ? row[target] : 0.0);
  }
}

void vocab_parallel_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& stats) {
  const int64_t ranks = stats.dim(0), tokens = stats.dim(2);
  std::vector<double> s = widen(stats);
  auto at = [&](int64_t r, int64_t k, int64_t t) { return s[size_t((r * 3 + k) * tokens + t)]; };
  for (int64_t t = 0; t < tokens; ++t) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < ranks; ++r) m = std::max(m, at(r, 0, t));
    double sum = 0, target = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      if (at(r, 1, t) != 0) sum += at(r, 1, t) * std::exp(at(r, 0, t) - m);
      target += at(r, 2, t);
    }
    const double l = m + std::log(sum);
    store(lse, t, l);
    store(losses, t, l - target);
  }
}

void vocab_parallel_cross_entropy_backward(const Tensor& dlogits, const Tensor& dlosses, const Tensor& logits,
                                           const Tensor& targets, const Tensor& lse, int64_t vocab_start,
                                           int64_t global_vocab) {
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  std::vector<double> x = widen(logits);  // a copy, so dlogits may alias logits
  std::vector<double> dl = widen(dlosses), saved_lse = widen(lse);
  visit_float_dtype(dlogits.dtype(), "cross_entropy_backward", [&]<class T>() {
    T* dx = static_cast<T*>(dlogits.data_ptr());
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t target = target_at(targets, t, global_vocab, "cross_entropy_backward") - vocab_start;
      for (int64_t v = 0; v < vocab; ++v) {
        double p = std::exp(x[size_t(t * vocab + v)] - saved_lse[size_t(t)]);
        dx[t * vocab + v] = from_double<T>(dl[size_t(t)] * (p - (v == target ? 1.0 : 0.0)));
      }
    }
  });
}

void masked_mean_loss(const Tensor& out, const Tensor& losses, const Tensor& loss_mask) {
  std::vector<double> l = widen(losses);
  double num = 0, den = 0;
  for (int64_t t = 0; t < losses.dim(0); ++t) {
    double m = mask_at(loss_mask, t);
    num += l[size_t(t)] * m;
    den += m;
  }
  store(out, 0, den == 0 ? 0.0 : num / den);
}

void masked_mean_loss_grad(const Tensor& dlosses, const Tensor& loss_mask, double denominator) {
  for (int64_t t = 0; t < dlosses.dim(0); ++t) store(dlosses, t, mask_at(loss_mask, t) / denominator);
}

}  // namespace megatron::ops::cpu
