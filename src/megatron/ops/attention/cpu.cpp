// CPU reference attention: plain loops in double over the bshd layout. O(B H S^2 D).
#include "megatron/ops/attention/cpu.h"

#include <cmath>
#include <limits>
#include <vector>

namespace megatron::ops::cpu {

namespace {

template <class T>
std::vector<double> widen(const Tensor& t) {
  const T* p = t.data<T>();
  std::vector<double> r(size_t(t.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = to_double(p[i]);
  return r;
}

template <class T>
void narrow(const Tensor& t, const std::vector<double>& values) {
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = from_double<T>(values[i]);
}

struct Dims {
  int64_t B, S, H, G, D;
  int64_t group() const { return H / G; }
  // Offsets of row (b, s, head) in a [B, S, heads, D] tensor.
  int64_t q_row(int64_t b, int64_t s, int64_t h) const { return ((b * S + s) * H + h) * D; }
  int64_t kv_row(int64_t b, int64_t s, int64_t g) const { return ((b * S + s) * G + g) * D; }
};

Dims dims_of(const Tensor& q, const Tensor& k) { return {q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)}; }

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k, const Tensor& v,
                       bool causal, double scale) {
  visit_float_dtype(q.dtype(), "attention_forward", [&]<class T>() {
    const Dims d = dims_of(q, k);
    std::vector<double> Q = widen<T>(q), K = widen<T>(k), V = widen<T>(v);
    std::vector<double> O(Q.size(), 0.0);
    float* lse = stats.data<float>();
    std::vector<double> score(size_t(d.S));
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t g = h / d.group();
        for (int64_t i = 0; i < d.S; ++i) {
          const int64_t last = causal ? i : d.S - 1;  // keys 0..last are visible
          const double* qi = &Q[size_t(d.q_row(b, i, h))];
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j <= last; ++j) {
            score[size_t(j)] = scale * dot(qi, &K[size_t(d.kv_row(b, j, g))], d.D);
            m = std::max(m, score[size_t(j)]);
          }
          double l = 0;
          double* oi = &O[size_t(d.q_row(b, i, h))];
          for (int64_t j = 0; j <= last; ++j) {
            double p = std::exp(score[size_t(j)] - m);
            l += p;
            const double* vj = &V[size_t(d.kv_row(b, j, g))];
            for (int64_t c = 0; c < d.D; ++c) oi[c] += p * vj[c];
          }
          for (int64_t c = 0; c < d.D; ++c) oi[c] /= l;
          lse[(b * d.H + h) * d.S + i] = float(m + std::log(l));
        }
      }
    narrow<T>(out, O);
  });
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats, bool causal,
                        double scale) {
  visit_float_dtype(q.dtype(), "attention_backward", [&]<class T>() {
    const Dims d = dims_of(q, k);
    std::vector<double> Q = widen<T>(q), K = widen<T>(k), V = widen<T>(v), O = widen<T>(out), dO = widen<T>(dout);
    std::vector<double> dQ(Q.size(), 0.0), dK(K.size(), 0.0), dV(V.size(), 0.0);
    const float* lse = stats.data<float>();
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t g = h / d.group();
        for (int64_t i = 0; i < d.S; ++i) {
          const int64_t last = causal ? i : d.S - 1;
          const size_t qi = size_t(d.q_row(b, i, h));
          const double row_lse = double(lse[(b * d.H + h) * d.S + i]);
          const double delta = dot(&dO[qi], &O[qi], d.D);  // rowsum(dO * O)
          for (int64_t j = 0; j <= last; ++j) {
            const size_t kj = size_t(d.kv_row(b, j, g));
            const double p = std::exp(scale * dot(&Q[qi], &K[kj], d.D) - row_lse);
            const double dp = dot(&dO[qi], &V[kj], d.D);
            const double ds = p * (dp - delta);
            for (int64_t c = 0; c < d.D; ++c) {
              dQ[qi + size_t(c)] += scale * ds * K[kj + size_t(c)];
              dK[kj + size_t(c)] += scale * ds * Q[qi + size_t(c)];
              dV[kj + size_t(c)] += p * dO[qi + size_t(c)];
            }
          }
        }
      }
    narrow<T>(dq, dQ);
    narrow<T>(dk, dK);
    narrow<T>(dv, dV);
  });
}

}  // namespace megatron::ops::cpu
