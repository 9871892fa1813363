#include "megatron/ops/activation/activation.h"

#include "megatron/ops/activation/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/activation/cuda.h"
#endif

namespace megatron::ops {
namespace {

void check_dtype(OpCheck& check, const Context& ctx, const char* name, const Tensor& t) {
  if (ctx.is_cuda()) check.dtype_in(name, t, {DType::F32, DType::BF16, DType::F16});
  else check.dtype_in(name, t, {DType::F64, DType::F32, DType::BF16, DType::F16});
}

void pointwise_forward(const char* op_name, Context& ctx, cpu::Pointwise op, const Tensor& y, const Tensor& x) {
  OpCheck check(op_name);
  check.device(ctx, {{"y", y}, {"x", x}});
  check_dtype(check, ctx, "x", x);
  check.shape("y", y, x.shape()).dtype("y", y, x.dtype());
  MEGATRON_DISPATCH(ctx, cuda::pointwise_forward(ctx, op, y, x), cpu::pointwise_forward(op, y, x));
}

void pointwise_backward(const char* op_name, Context& ctx, cpu::Pointwise op, const Tensor& dx, const Tensor& dy,
                        const Tensor& x) {
  OpCheck check(op_name);
  check.device(ctx, {{"dx", dx}, {"dy", dy}, {"x", x}});
  check_dtype(check, ctx, "x", x);
  check.shape("dy", dy, x.shape()).dtype("dy", dy, x.dtype());
  check.shape("dx", dx, x.shape()).dtype("dx", dx, x.dtype());
  MEGATRON_DISPATCH(ctx, cuda::pointwise_backward(ctx, op, dx, dy, x), cpu::pointwise_backward(op, dx, dy, x));
}

// The [..., F] shape of SwiGLU's output for x [..., 2F].
Shape swiglu_out_shape(OpCheck& check, const Tensor& x) {
  check.that(x.rank() >= 1 && x.shape().cols() % 2 == 0, "argument x is ", x.describe(),
             " but must have an even last extent (gate and up projections, [..., 2F])");
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() /= 2;
  return Shape(dims);
}

}  // namespace

void gelu_forward(Context& ctx, const Tensor& y, const Tensor& x) {
  pointwise_forward("gelu_forward", ctx, cpu::Pointwise::Gelu, y, x);
}
void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  pointwise_backward("gelu_backward", ctx, cpu::Pointwise::Gelu, dx, dy, x);
}
void silu_forward(Context& ctx, const Tensor& y, const Tensor& x) {
  pointwise_forward("silu_forward", ctx, cpu::Pointwise::Silu, y, x);
}
void silu_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  pointwise_backward("silu_backward", ctx, cpu::Pointwise::Silu, dx, dy, x);
}

void swiglu_forward(Context& ctx, const Tensor& y, const Tensor& x) {
  OpCheck check("swiglu_forward");
  check.device(ctx, {{"y", y}, {"x", x}});
  check_dtype(check, ctx, "x", x);
  check.shape("y", y, swiglu_out_shape(check, x)).dtype("y", y, x.dtype());
  MEGATRON_DISPATCH(ctx, cuda::swiglu_forward(ctx, y, x), cpu::swiglu_forward(y, x));
}

void swiglu_backward(Context& ctx, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  OpCheck check("swiglu_backward");
  check.device(ctx, {{"dx", dx}, {"dy", dy}, {"x", x}});
  check_dtype(check, ctx, "x", x);
  check.shape("dy", dy, swiglu_out_shape(check, x)).dtype("dy", dy, x.dtype());
  check.shape("dx", dx, x.shape()).dtype("dx", dx, x.dtype());
  MEGATRON_DISPATCH(ctx, cuda::swiglu_backward(ctx, dx, dy, x), cpu::swiglu_backward(dx, dy, x));
}

}  // namespace megatron::ops
