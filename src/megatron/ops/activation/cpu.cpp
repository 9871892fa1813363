// CPU reference: fp64 math on widened values, one rounding per output element.
#include "megatron/ops/activation/cpu.h"

#include <cmath>

namespace megatron::ops::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCoeff = 0.044715;

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCoeff * x * x);
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }
double silu_grad(double x) {
  const double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

}  // namespace

void pointwise_forward(Pointwise op, const Tensor& y, const Tensor& x) {
  visit_float_dtype(x.dtype(), "activation (cpu)", [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = to_double(px[i]);
      py[i] = from_double<T>(op == Pointwise::Gelu ? gelu(v) : silu(v));
    }
  });
}

void pointwise_backward(Pointwise op, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  visit_float_dtype(x.dtype(), "activation (cpu)", [&]<class T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = to_double(px[i]);
      pdx[i] = from_double<T>(to_double(pdy[i]) * (op == Pointwise::Gelu ? gelu_grad(v) : silu_grad(v)));
    }
  });
}

void swiglu_forward(const Tensor& y, const Tensor& x) {
  const int64_t rows = x.shape().rows(), f = x.shape().cols() / 2;
  visit_float_dtype(x.dtype(), "swiglu (cpu)", [&]<class T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        const double gate = to_double(px[r * 2 * f + c]), up = to_double(px[r * 2 * f + f + c]);
        py[r * f + c] = from_double<T>(silu(gate) * up);
      }
  });
}

void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t rows = x.shape().rows(), f = x.shape().cols() / 2;
  visit_float_dtype(x.dtype(), "swiglu (cpu)", [&]<class T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < f; ++c) {
        const double gate = to_double(px[r * 2 * f + c]), up = to_double(px[r * 2 * f + f + c]);
        const double g = to_double(pdy[r * f + c]);
        pdx[r * 2 * f + c] = from_double<T>(g * up * silu_grad(gate));
        pdx[r * 2 * f + f + c] = from_double<T>(g * silu(gate));
      }
  });
}

}  // namespace megatron::ops::cpu
