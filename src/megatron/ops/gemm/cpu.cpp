#include "megatron/ops/gemm/cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace megatron::ops::cpu {
namespace {

float scalar_or_one(const Tensor& t) { return t.defined() ? t.data<float>()[0] : 1.0f; }

// All elements of `t` widened to Acc and multiplied by `scale`.
template <class Acc>
std::vector<Acc> widen(const Tensor& t, float scale) {
  std::vector<Acc> out(size_t(t.numel()));
  visit_float_dtype(t.dtype(), "gemm", [&]<class T>() {
    const T* p = t.data<T>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = Acc(to_double(p[i])) * Acc(scale);
  });
  return out;
}

void blas_gemm(bool ta, bool tb, const GemmDims& g, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(g.m), int(g.n),
              int(g.k), 1.0f, a, int(g.lda), b, int(g.ldb), 0.0f, c, int(g.n));
}
void blas_gemm(bool ta, bool tb, const GemmDims& g, const double* a, const double* b, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(g.m), int(g.n),
              int(g.k), 1.0, a, int(g.lda), b, int(g.ldb), 0.0, c, int(g.n));
}

// acc[batch * M * N] = op(A) @ op(B) (no alpha/beta), in Acc precision (float: sgemm, double: dgemm).
template <class Acc>
std::vector<Acc> products(const Tensor& a, const Tensor& b, const GemmOptions& opt, const GemmDims& g) {
  std::vector<Acc> acc(size_t(g.batch * g.m * g.n), Acc(0));
  if (acc.empty() || g.k == 0) return acc;
  MEGATRON_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && g.lda <= INT32_MAX &&
                     g.ldb <= INT32_MAX,
                 "gemm: the CPU backend (BLAS) needs every dimension below 2^31; got M=", g.m, " N=", g.n, " K=", g.k);
  std::vector<Acc> wa, wb;
  const Acc* pa;
  const Acc* pb;
  if (a.dtype() == dtype_v<Acc>) {
    pa = a.data<Acc>();
  } else {
    wa = widen<Acc>(a, scalar_or_one(opt.a_scale));
    pa = wa.data();
  }
  if (b.dtype() == dtype_v<Acc>) {
    pb = b.data<Acc>();
  } else {
    wb = widen<Acc>(b, scalar_or_one(opt.b_scale));
    pb = wb.data();
  }
  for (int64_t i = 0; i < g.batch; ++i)
    blas_gemm(opt.transpose_a, opt.transpose_b, g, pa + i * g.stride_a(), pb + i * g.stride_b(),
              acc.data() + i * g.stride_d());
  return acc;
}

// D = round(d_scale * epilogue(alpha * acc + beta * C)), plus the aux output and amax.
template <class Acc>
void epilogue(const Tensor& d, const std::vector<Acc>& acc, const GemmOptions& opt, const GemmDims& g) {
  const bool has_bias = opt.epilogue == GemmEpilogue::Bias || opt.epilogue == GemmEpilogue::BiasGelu;
  const bool has_gelu = opt.epilogue == GemmEpilogue::Gelu || opt.epilogue == GemmEpilogue::BiasGelu;
  std::vector<double> bias;
  if (has_bias) {
    visit_float_dtype(opt.bias.dtype(), "gemm", [&]<class TB>() {
      const TB* p = opt.bias.data<TB>();
      for (int64_t j = 0; j < g.n; ++j) bias.push_back(to_double(p[j]));
    });
  }
  const double alpha = opt.alpha, beta = opt.beta;
  const double d_scale = scalar_or_one(opt.d_scale);
  double amax = 0;
  visit_float_dtype(d.dtype(), "gemm", [&]<class TD>() {
    TD* out = d.data<TD>();
    TD* aux = opt.gelu_input_out.defined() ? opt.gelu_input_out.data<TD>() : nullptr;
    const TD* gelu_in = opt.epilogue == GemmEpilogue::DGelu ? opt.gelu_input.data<TD>() : nullptr;
    const int64_t total = int64_t(acc.size());
    for (int64_t i = 0; i < total; ++i) {
      double t = alpha * double(acc[size_t(i)]);
      if (beta != 0) t += beta * to_double(out[i]);  // D is read as C only when beta != 0
      if (has_bias) t += bias[size_t(i % g.n)];
      if (has_gelu) {
        if (aux != nullptr) aux[i] = from_double<TD>(t);
        t = gelu_tanh(t);
      }
      if (gelu_in != nullptr) t *= gelu_tanh_grad(to_double(gelu_in[i]));
      amax = std::max(amax, std::abs(t));
      out[i] = from_double<TD>(d_scale * t);
    }
  });
  if (opt.d_amax_out.defined()) opt.d_amax_out.data<float>()[0] = float(amax);
}

// bias_grad_out[m] = sum_k op(A)[m, k], in double.
void row_sums_of_op_a(const Tensor& out, const Tensor& a, const GemmOptions& opt, const GemmDims& g) {
  std::vector<double> wa = widen<double>(a, 1.0f);
  visit_float_dtype(out.dtype(), "gemm", [&]<class TO>() {
    TO* o = out.data<TO>();
    for (int64_t m = 0; m < g.m; ++m) {
      double s = 0;
      for (int64_t k = 0; k < g.k; ++k) s += opt.transpose_a ? wa[size_t(k * g.lda + m)] : wa[size_t(m * g.lda + k)];
      o[m] = from_double<TO>(s);
    }
  });
}

}  // namespace

void gemm(Context& ctx, const Tensor& d, const Tensor& a, const Tensor& b, const GemmOptions& opt, const GemmDims& g) {
  if (a.dtype() == DType::F64) {
    epilogue<double>(d, products<double>(a, b, opt, g), opt, g);
  } else {
    epilogue<float>(d, products<float>(a, b, opt, g), opt, g);
  }
  if (opt.bias_grad_out.defined()) row_sums_of_op_a(opt.bias_grad_out, a, opt, g);
}

}  // namespace megatron::ops::cpu
