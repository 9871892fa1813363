#include "megatron/nn/linear_operand.h"

#include "megatron/ops/activation/activation.h"

namespace megatron::nn {

LinearOperand LinearOperand::swiglu(Tensor x) {
  MEGATRON_CHECK(x.defined() && x.shape().cols() % 2 == 0, "LinearOperand::swiglu: the input ", x.describe(),
                 " must be [rows, 2F] (SwiGLU's [gate | up])");
  return LinearOperand(Op::Swiglu, std::move(x), Tensor());
}

LinearOperand LinearOperand::swiglu_grad(Tensor dy, Tensor x) {
  MEGATRON_CHECK(
      x.defined() && dy.defined() && x.shape().cols() == 2 * dy.shape().cols() && x.shape().rows() == dy.shape().rows(),
      "LinearOperand::swiglu_grad: dy ", dy.describe(), " must be [rows, F] for x ", x.describe(), " [rows, 2F]");
  return LinearOperand(Op::SwigluGrad, std::move(x), std::move(dy));
}

const Tensor& LinearOperand::tensor() const {
  MEGATRON_CHECK(stored(), "LinearOperand: the tensor of a produced operand was asked for; materialise() it");
  return x_;
}

int64_t LinearOperand::cols() const { return op_ == Op::Swiglu ? x_.shape().cols() / 2 : x_.shape().cols(); }

Tensor LinearOperand::materialise(Context& ctx) const {
  switch (op_) {
    case Op::Stored:
      return x_;
    case Op::Swiglu: {
      Tensor y = ctx.empty({rows(), cols()}, dtype());
      ops::swiglu_forward(ctx, y, x_.view({rows(), x_.shape().cols()}));
      return y;
    }
    case Op::SwigluGrad: {
      Tensor dx = ctx.empty({rows(), cols()}, dtype());
      ops::swiglu_backward(ctx, dx, dy_.view({rows(), dy_.shape().cols()}), x_.view({rows(), cols()}));
      return dx;
    }
  }
  MEGATRON_FAIL("LinearOperand: unknown op");
}

}  // namespace megatron::nn
