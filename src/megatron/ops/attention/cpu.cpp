// CPU attention as blocked matrix products: for one head and a block of queries, the scores S = scale Q K^T
// and the outputs P V (and in the backward dP = dO V^T, dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO)
// are single-threaded BLAS calls on strided views of the bshd tensors; the softmax between them is fused
// (row max, exp, sum, log-sum-exp) and works on the block while it is in cache.
//
// Parallelism (ops/cpu_parallel.h). Forward: one task per (batch, head, query block). Backward: one task
// per (batch, key/value group), which walks its heads and query blocks in a fixed order, so dK and dV (sums
// over the group's heads and over query blocks) come out the same for every thread count.
//
// Precision: double throughout, for every storage type (inputs widened once, dgemm products, cpu_math.h's
// vectorised exp_f64, one rounding per output), as the per-element reference it replaces. Not fp32:
// attention's gradients hold exact cancellations (each row of dS sums to zero, so a key bias gets no
// gradient) that fp32 rounding turns into noise of ~1e-7 of |P dP|; Adam normalises that noise into real
// updates, and the data-parallel equivalence tests (1e-5 relative to DP=1) see them. Attention is a few
// percent of a step's FLOPs at the sequence lengths the CPU trains, so double costs little.
//
// Dropout (attention_dropout.h): each row's factors (0 or 1 / (1 - p)) are drawn for its visible keys only and
// multiply the probabilities after the softmax's sums are taken (forward) or after they are recomputed from
// the stats (backward), in double like everything else.
#include "megatron/ops/attention/cpu.h"

#include <cblas.h>

#include <cmath>
#include <limits>
#include <vector>

#include "megatron/ops/cpu_math.h"
#include "megatron/ops/cpu_parallel.h"

namespace megatron::ops::cpu {

namespace {

// Query rows per block: the block's scores (rows x keys) stay in L2 for sequences of a few thousand.
constexpr int64_t kQueryBlock = 64;

void blas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// A tensor's values as doubles: the tensor itself when it holds doubles, else a widened copy.
struct Values {
  std::vector<double> copy;
  const double* data = nullptr;
};

template <class T>
Values values_of(const Tensor& t) {
  Values v;
  if constexpr (std::is_same_v<T, double>) {
    v.data = t.data<double>();
  } else {
    v.copy.resize(size_t(t.numel()));
    const T* p = t.data<T>();
    double* out = v.copy.data();
    parallel_for(t.numel(), kStreamBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = to_double(p[i]);
    });
    v.data = v.copy.data();
  }
  return v;
}

struct Dims {
  int64_t B, Sq, Skv, H, G, D;
  int64_t group() const { return H / G; }
  int64_t blocks() const { return (Sq + kQueryBlock - 1) / kQueryBlock; }
  // Element offsets of row (b, s, head) in [B, Sq, H, D] and [B, Skv, G, D] tensors; rows of one head are H*D
  // (G*D) apart.
  int64_t q_row(int64_t b, int64_t s, int64_t h) const { return ((b * Sq + s) * H + h) * D; }
  int64_t kv_row(int64_t b, int64_t s, int64_t g) const { return ((b * Skv + s) * G + g) * D; }
  // Row (b, h, i) of stats [B, H, Sq, 1].
  int64_t stats_row(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * Sq + i; }
};

Dims dims_of(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

// The dropout factors of query rows [i0, i0 + rows) of head h of batch entry b over their first `visible(r)` keys,
// row-major with `keys` columns (nothing when dropout is off).
template <class Visible>
void dropout_factors(const Dims& d, const AttentionDropout& dropout, int64_t b, int64_t h, int64_t i0, int64_t rows,
                     int64_t keys, Visible visible, std::vector<double>& factors) {
  if (!dropout.enabled()) return;
  factors.resize(static_cast<size_t>(rows * keys));
  for (int64_t r = 0; r < rows; ++r)
    attention_dropout_factors(dropout, d.H, d.Skv, b, h, i0 + r, visible(r), factors.data() + r * keys);
}

// The last key query i sees, and the keys a block of queries ending before i1 needs. Causal is bottom-right
// aligned (attention.h): query i sits at position i + Skv - Sq of the keys' sequence (Skv >= Sq, checked by
// the caller, so every query sees at least key 0).
int64_t last_key(const Dims& d, bool causal, int64_t i) { return causal ? i + d.Skv - d.Sq : d.Skv - 1; }
int64_t keys_for(const Dims& d, bool causal, int64_t i1) { return causal ? i1 + d.Skv - d.Sq : d.Skv; }

// Turns a block's scaled scores (rows x keys, row r is query i0 + r) into probabilities in place:
// p = exp(s - shift_r) for the visible keys, 0 for the masked ones. shift_r is the row's log-sum-exp when
// `lse` is given (backward), else the row's maximum, and the row's sum of p goes to sums[r] (forward).
MEGATRON_CPU_CLONES void softmax_rows(const Dims& d, bool causal, double* p, int64_t rows, int64_t keys, int64_t i0,
                                      const float* lse, double* shift, double* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    double* row = p + r * keys;
    const int64_t visible = last_key(d, causal, i0 + r) + 1;
    double m;
    if (lse != nullptr) {
      m = double(lse[i0 + r]);
    } else {
      m = -std::numeric_limits<double>::infinity();
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < visible; ++j) m = std::max(m, row[j]);
    }
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < visible; ++j) {
      row[j] = exp_f64(row[j] - m);
      s += row[j];
    }
    for (int64_t j = visible; j < keys; ++j) row[j] = 0.0;
    if (shift != nullptr) shift[r] = m;
    if (sums != nullptr) sums[r] = s;
  }
}

// Forward of query rows [i0, i1) of head h of batch entry b: out rows and their log-sum-exp.
template <class T>
void forward_block(const Dims& d, bool causal, double scale, const AttentionDropout& dropout, const double* Q,
                   const double* K, const double* V, T* out, float* lse, int64_t b, int64_t h, int64_t i0, int64_t i1) {
  const int64_t g = h / d.group(), rows = i1 - i0, keys = keys_for(d, causal, i1);
  std::vector<double> p(static_cast<size_t>(rows * keys)), o(static_cast<size_t>(rows * d.D)),
      m(static_cast<size_t>(rows)), sum(static_cast<size_t>(rows)), factors;
  blas(false, true, rows, keys, d.D, scale, Q + d.q_row(b, i0, h), d.H * d.D, K + d.kv_row(b, 0, g), d.G * d.D, 0.0,
       p.data(), keys);
  softmax_rows(d, causal, p.data(), rows, keys, i0, nullptr, m.data(), sum.data());
  const auto visible = [&](int64_t r) { return last_key(d, causal, i0 + r) + 1; };
  dropout_factors(d, dropout, b, h, i0, rows, keys, visible, factors);
  for (size_t e = 0; e < factors.size(); ++e) p[e] *= factors[e];  // masked keys: p is 0 already
  blas(false, false, rows, d.D, keys, 1.0, p.data(), keys, V + d.kv_row(b, 0, g), d.G * d.D, 0.0, o.data(), d.D);
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = out + d.q_row(b, i0 + r, h);
    for (int64_t c = 0; c < d.D; ++c) dst[c] = from_double<T>(o[size_t(r * d.D + c)] / sum[size_t(r)]);
    lse[d.stats_row(b, h, i0 + r)] = float(m[size_t(r)] + std::log(sum[size_t(r)]));
  }
}

// The inputs of the backward as doubles.
struct BackwardInputs {
  Values Q, K, V, O, dO;
};

// One query block of one head inside backward_group: writes its dq rows and adds its share to the
// group's dK and dV accumulators ([Skv, D] each, key rows of this batch entry and group).
template <class T>
void backward_block(const Dims& d, bool causal, double scale, const AttentionDropout& dropout, const BackwardInputs& in,
                    const float* lse, T* dq, double* dk_acc, double* dv_acc, int64_t b, int64_t h, int64_t i0,
                    int64_t i1) {
  const int64_t g = h / d.group(), rows = i1 - i0, keys = keys_for(d, causal, i1);
  const int64_t q_ld = d.H * d.D, kv_ld = d.G * d.D;
  const double* q = in.Q.data + d.q_row(b, i0, h);
  const double* dout = in.dO.data + d.q_row(b, i0, h);
  const double* k = in.K.data + d.kv_row(b, 0, g);
  const double* v = in.V.data + d.kv_row(b, 0, g);
  std::vector<double> p(static_cast<size_t>(rows * keys)), ds(static_cast<size_t>(rows * keys)),
      dq_block(static_cast<size_t>(rows * d.D)), factors;
  blas(false, true, rows, keys, d.D, scale, q, q_ld, k, kv_ld, 0.0, p.data(), keys);
  softmax_rows(d, causal, p.data(), rows, keys, i0, lse + d.stats_row(b, h, 0), nullptr, nullptr);
  blas(false, true, rows, keys, d.D, 1.0, dout, q_ld, v, kv_ld, 0.0, ds.data(), keys);  // dP = dO V^T
  const auto visible = [&](int64_t r) { return last_key(d, causal, i0 + r) + 1; };
  dropout_factors(d, dropout, b, h, i0, rows, keys, visible, factors);
  for (int64_t r = 0; r < rows; ++r) {
    const double* o_row = in.O.data + d.q_row(b, i0 + r, h);
    double delta = 0;  // rowsum(dO * O), O the (dropped) output
    for (int64_t c = 0; c < d.D; ++c) delta += dout[r * q_ld + c] * o_row[c];
    double* ds_row = ds.data() + r * keys;
    double* p_row = p.data() + r * keys;
    if (factors.empty()) {
#pragma omp simd
      for (int64_t j = 0; j < keys; ++j) ds_row[j] = p_row[j] * (ds_row[j] - delta);  // masked: p = 0
    } else {  // dP o M / (1 - p); then P o M / (1 - p) for dV
      const double* f_row = factors.data() + r * keys;
#pragma omp simd
      for (int64_t j = 0; j < keys; ++j) {
        ds_row[j] = p_row[j] * (ds_row[j] * f_row[j] - delta);
        p_row[j] *= f_row[j];
      }
    }
  }
  blas(false, false, rows, d.D, keys, scale, ds.data(), keys, k, kv_ld, 0.0, dq_block.data(), d.D);
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = dq + d.q_row(b, i0 + r, h);
    for (int64_t c = 0; c < d.D; ++c) dst[c] = from_double<T>(dq_block[size_t(r * d.D + c)]);
  }
  blas(true, false, keys, d.D, rows, scale, ds.data(), keys, q, q_ld, 1.0, dk_acc, d.D);  // dK += scale dS^T Q
  blas(true, false, keys, d.D, rows, 1.0, p.data(), keys, dout, q_ld, 1.0, dv_acc, d.D);  // dV += P^T dO
}

// dq of the group's heads, dk and dv of group g of batch entry b: heads and query blocks in a fixed order.
template <class T>
void backward_group(const Dims& d, bool causal, double scale, const AttentionDropout& dropout, const BackwardInputs& in,
                    const float* lse, T* dq, T* dk, T* dv, int64_t b, int64_t g) {
  std::vector<double> dk_acc(static_cast<size_t>(d.Skv * d.D), 0.0), dv_acc(static_cast<size_t>(d.Skv * d.D), 0.0);
  for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h)
    for (int64_t i0 = 0; i0 < d.Sq; i0 += kQueryBlock)
      backward_block<T>(d, causal, scale, dropout, in, lse, dq, dk_acc.data(), dv_acc.data(), b, h, i0,
                        std::min(d.Sq, i0 + kQueryBlock));
  for (int64_t s = 0; s < d.Skv; ++s)
    for (int64_t c = 0; c < d.D; ++c) {
      dk[d.kv_row(b, s, g) + c] = from_double<T>(dk_acc[size_t(s * d.D + c)]);
      dv[d.kv_row(b, s, g) + c] = from_double<T>(dv_acc[size_t(s * d.D + c)]);
    }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k, const Tensor& v,
                       bool causal, double scale, const AttentionDropout& dropout) {
  visit_float_dtype(q.dtype(), "attention_forward", [&]<class T>() {
    const Dims d = dims_of(q, k);
    const Values Q = values_of<T>(q), K = values_of<T>(k), V = values_of<T>(v);
    T* o = out.data<T>();
    float* lse = stats.data<float>();
    const int64_t blocks = d.blocks();
    parallel_for(d.B * d.H * blocks, 1, [&](int64_t task, int64_t) {
      const int64_t bh = task / blocks, i0 = (task % blocks) * kQueryBlock;
      forward_block<T>(d, causal, scale, dropout, Q.data, K.data, V.data, o, lse, bh / d.H, bh % d.H, i0,
                       std::min(d.Sq, i0 + kQueryBlock));
    });
  });
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats, bool causal,
                        double scale, const AttentionDropout& dropout) {
  visit_float_dtype(q.dtype(), "attention_backward", [&]<class T>() {
    const Dims d = dims_of(q, k);
    const BackwardInputs in{values_of<T>(q), values_of<T>(k), values_of<T>(v), values_of<T>(out), values_of<T>(dout)};
    T *pdq = dq.data<T>(), *pdk = dk.data<T>(), *pdv = dv.data<T>();
    const float* lse = stats.data<float>();
    parallel_for(d.B * d.G, 1, [&](int64_t task, int64_t) {
      backward_group<T>(d, causal, scale, dropout, in, lse, pdq, pdk, pdv, task / d.G, task % d.G);
    });
  });
}

}  // namespace megatron::ops::cpu
