#include "megatron/ops/dropout/dropout.h"

#include <cmath>

#include "megatron/ops/dropout/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/dropout/cuda.h"
#endif

namespace megatron::ops {
namespace {

void run(const char* op, Context& ctx, const char* out_name, const Tensor& y, const char* in_name, const Tensor& x,
         const Tensor& bias, const Tensor& residual, float p, uint64_t seed, uint64_t offset, uint64_t index_base) {
  OpCheck check(op);
  check.device(ctx, {{out_name, y}, {in_name, x}});
  if (bias.defined()) check.device(ctx, {{"bias", bias}});
  if (residual.defined()) check.device(ctx, {{"residual", residual}});
  if (ctx.is_cuda()) check.dtype_in(in_name, x, {DType::F32, DType::BF16, DType::F16});
  else check.dtype_in(in_name, x, {DType::F64, DType::F32, DType::BF16, DType::F16});
  check.shape(out_name, y, x.shape()).dtype(out_name, y, x.dtype());
  if (bias.defined()) {
    check.that(x.rank() >= 1, "argument ", in_name, " is ", x.describe(), " but must have rank >= 1 with a bias");
    check.shape("bias", bias, Shape{x.shape().cols()}).dtype("bias", bias, x.dtype());
  }
  if (residual.defined()) check.shape("residual", residual, x.shape()).dtype("residual", residual, x.dtype());
  check.that(std::isfinite(p) && p >= 0.f && p <= 1.f, "dropout probability p must be in [0, 1], got ", p);
  check.that(index_base <= UINT64_MAX - uint64_t(x.numel()), "index_base ", index_base, " + ", x.numel(),
             " elements overflows 64 bits");
  MEGATRON_DISPATCH(ctx,
                    cuda::dropout(ctx, y, x, bias, residual, p, seed, offset, index_base),
                    cpu::dropout(y, x, bias, residual, p, seed, offset, index_base));
}

}  // namespace

void dropout_forward(Context& ctx, const Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset,
                     uint64_t index_base) {
  run("dropout_forward", ctx, "y", y, "x", x, Tensor(), Tensor(), p, seed, offset, index_base);
}

void dropout_backward(Context& ctx, const Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset,
                      uint64_t index_base) {
  run("dropout_backward", ctx, "dx", dx, "dy", dy, Tensor(), Tensor(), p, seed, offset, index_base);
}

void bias_dropout_add_forward(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& bias,
                              const Tensor& residual, float p, uint64_t seed, uint64_t offset, uint64_t index_base) {
  OpCheck("bias_dropout_add_forward").defined("residual", residual);
  run("bias_dropout_add_forward", ctx, "y", y, "x", x, bias, residual, p, seed, offset, index_base);
}

}  // namespace megatron::ops
