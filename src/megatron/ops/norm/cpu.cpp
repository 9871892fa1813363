// CPU reference: every tensor is widened to double, the math runs in double, and outputs are rounded once
// to their dtype. Clarity over speed.
#include "megatron/ops/norm/cpu.h"

#include <cmath>
#include <vector>

namespace megatron::ops::cpu {
namespace {

std::vector<double> load(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  visit_float_dtype(t.dtype(), "norm (cpu)", [&]<class T>() {
    const T* p = static_cast<const T*>(t.data_ptr());
    for (size_t i = 0; i < v.size(); ++i) v[i] = to_double(p[i]);
  });
  return v;
}

void store(const Tensor& t, const std::vector<double>& v) {
  visit_float_dtype(t.dtype(), "norm (cpu)", [&]<class T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (size_t i = 0; i < v.size(); ++i) p[i] = from_double<T>(v[i]);
  });
}

// The value `v` takes once stored in dtype `d`.
double round_to(DType d, double v) {
  return visit_float_dtype(d, "norm (cpu)", [&]<class T>() { return to_double(from_double<T>(v)); });
}

}  // namespace

void norm_forward(bool rms, const Tensor& y, const Tensor& residual_out, const Tensor& mean, const Tensor& rstd,
                  const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, float eps) {
  const int64_t h = x.shape().cols(), rows = x.shape().rows();
  std::vector<double> xv = load(x);
  if (residual.defined()) {
    std::vector<double> rv = load(residual);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = round_to(x.dtype(), xv[i] + rv[i]);
    store(residual_out, xv);
  }
  const std::vector<double> w = load(weight);
  const std::vector<double> b = bias.defined() ? load(bias) : std::vector<double>(size_t(h), 0.0);
  std::vector<double> yv(xv.size()), mean_v(static_cast<size_t>(rows)), rstd_v(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = xv.data() + r * h;
    double mu = 0;
    if (!rms) {
      for (int64_t c = 0; c < h; ++c) mu += xr[c];
      mu /= double(h);
    }
    double var = 0;
    for (int64_t c = 0; c < h; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    var /= double(h);
    double rs = 1.0 / std::sqrt(var + double(eps));
    for (int64_t c = 0; c < h; ++c) yv[size_t(r * h + c)] = (xr[c] - mu) * rs * w[size_t(c)] + b[size_t(c)];
    mean_v[size_t(r)] = mu;
    rstd_v[size_t(r)] = rs;
  }
  store(y, yv);
  store(rstd, rstd_v);
  if (!rms) store(mean, mean_v);
}

void norm_backward(bool rms, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                   const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                   bool accumulate_weight_grads, const Tensor& dresidual) {
  const int64_t h = x.shape().cols(), rows = x.shape().rows();
  const std::vector<double> xv = load(x), dyv = load(dy), w = load(weight), rstd_v = load(rstd);
  const std::vector<double> mean_v = rms ? std::vector<double>(size_t(rows), 0.0) : load(mean);
  const std::vector<double> dres = dresidual.defined() ? load(dresidual) : std::vector<double>(xv.size(), 0.0);
  std::vector<double> dxv(xv.size());
  std::vector<double> dw = accumulate_weight_grads ? load(dweight) : std::vector<double>(size_t(h), 0.0);
  std::vector<double> db(size_t(h), 0.0);
  if (dbias.defined() && accumulate_weight_grads) db = load(dbias);
  std::vector<double> xhat(static_cast<size_t>(h)), g(static_cast<size_t>(h));
  for (int64_t r = 0; r < rows; ++r) {
    const double mu = mean_v[size_t(r)], rs = rstd_v[size_t(r)];
    double sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < h; ++c) {
      size_t i = size_t(r * h + c);
      xhat[size_t(c)] = (xv[i] - mu) * rs;
      g[size_t(c)] = dyv[i] * w[size_t(c)];
      sum_g += g[size_t(c)];
      sum_gx += g[size_t(c)] * xhat[size_t(c)];
      dw[size_t(c)] += dyv[i] * xhat[size_t(c)];
      db[size_t(c)] += dyv[i];
    }
    // d/dx of (x - mean) * rstd: LayerNorm removes the mean of g and the projection on xhat; RMSNorm only
    // the projection.
    const double mean_g = rms ? 0.0 : sum_g / double(h), mean_gx = sum_gx / double(h);
    for (int64_t c = 0; c < h; ++c) {
      size_t i = size_t(r * h + c);
      dxv[i] = rs * (g[size_t(c)] - mean_g - xhat[size_t(c)] * mean_gx) + dres[i];
    }
  }
  store(dx, dxv);
  store(dweight, dw);
  if (dbias.defined()) store(dbias, db);
}

}  // namespace megatron::ops::cpu
