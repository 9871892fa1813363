// LinearOperand: what a linear layer reads as its input (forward) or its output gradient (backward), named
// either as a stored tensor or as the pointwise op that produces it. An FP8 linear under delayed scaling
// computes a produced operand inside its own cast (ops/fp8's fused casts: the values are never stored and
// read back); every other consumer calls materialise(), which runs the op on its own, so a layer in the
// parameter dtype computes exactly what it did from the stored tensor.
//   stored(t):            t itself ([rows, cols]; any rank, the last dimension the columns);
//   swiglu(x):            swiglu_forward of x [rows, 2F] (activation.h's [gate | up] layout)  -> [rows, F];
//   swiglu_grad(dy, x):   swiglu_backward(dy, x), dy [rows, F], x [rows, 2F]                   -> [rows, 2F].
// A Tensor converts to stored(t) implicitly, so a layer taking a LinearOperand takes a tensor as before.
#pragma once

#include <utility>

#include "megatron/runtime/context.h"

namespace megatron::nn {

class LinearOperand {
 public:
  enum class Op { Stored, Swiglu, SwigluGrad };

  LinearOperand(const Tensor& t) : op_(Op::Stored), x_(t) {}  // NOLINT(google-explicit-constructor): see above
  // The op's inputs are held (moved in when the caller gives them up) until the operand is dropped.
  static LinearOperand swiglu(Tensor x);
  static LinearOperand swiglu_grad(Tensor dy, Tensor x);

  Op op() const { return op_; }
  bool stored() const { return op_ == Op::Stored; }
  // The stored tensor (stored operands only).
  const Tensor& tensor() const;
  // The op's inputs: x (SwiGLU's [gate | up]) and dy (the gradient of SwiGLU's output).
  const Tensor& x() const { return x_; }
  const Tensor& dy() const { return dy_; }

  int64_t rows() const { return x_.shape().rows(); }
  int64_t cols() const;
  DType dtype() const { return x_.dtype(); }
  bool defined() const { return x_.defined(); }

  // The operand as a tensor: the stored one, or the op's output in a new tensor [rows, cols].
  Tensor materialise(Context& ctx) const;

 private:
  LinearOperand(Op op, Tensor x, Tensor dy) : op_(op), x_(std::move(x)), dy_(std::move(dy)) {}

  Op op_;
  Tensor x_;
  Tensor dy_;
};

}  // namespace megatron::nn
