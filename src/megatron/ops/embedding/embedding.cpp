#include "megatron/ops/embedding/embedding.h"

#include "megatron/ops/embedding/cpu.h"
#include "megatron/ops/dispatch.h"
#include "megatron/tensor/op_checks.h"

#if MEGATRON_WITH_CUDA
#include "megatron/ops/embedding/cuda.h"
#endif

namespace megatron::ops {
namespace {

// ids.shape() + [hidden]
Shape rows_shape(const Tensor& ids, int64_t hidden) {
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(hidden);
  return Shape(std::move(dims));
}

void check_float(OpCheck& check, const Context& ctx, const char* name, const Tensor& t) {
  if (ctx.is_cuda()) check.dtype_in(name, t, {DType::F32, DType::BF16, DType::F16});
  else check.dtype_in(name, t, {DType::F32, DType::BF16, DType::F16, DType::F64});
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids) {
  OpCheck check("embedding_forward");
  check.device(ctx, {{"out", out}, {"weight", weight}, {"ids", ids}}).rank("weight", weight, 2);
  check_float(check, ctx, "weight", weight);
  check.dtype_in("ids", ids, {DType::I32, DType::I64})
      .dtype("out", out, weight.dtype())
      .shape("out", out, rows_shape(ids, weight.dim(1)));
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::embedding_forward(ctx, out, weight, ids), cpu::embedding_forward(out, weight, ids));
}

void embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate) {
  OpCheck check("embedding_backward");
  check.device(ctx, {{"dweight", dweight}, {"dout", dout}, {"ids", ids}}).rank("dweight", dweight, 2);
  check_float(check, ctx, "dout", dout);
  if (!ctx.is_cuda() && dout.dtype() == DType::F64) check.dtype_in("dweight", dweight, {DType::F32, DType::F64});
  else check.dtype("dweight", dweight, DType::F32);
  check.dtype_in("ids", ids, {DType::I32, DType::I64}).shape("dout", dout, rows_shape(ids, dweight.dim(1)));
  if (dweight.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::embedding_backward(ctx, dweight, dout, ids, accumulate),
                    cpu::embedding_backward(dweight, dout, ids, accumulate));
}

}  // namespace megatron::ops
