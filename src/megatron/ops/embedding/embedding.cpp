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

void check_shard(OpCheck& check, const Tensor& table, int64_t vocab_start, int64_t global_vocab) {
  if (table.rank() != 2) return;
  check.that(vocab_start >= 0 && vocab_start + table.dim(0) <= global_vocab, "the shard [", vocab_start, ", ",
             vocab_start + table.dim(0), ") of table ", table.describe(), " must lie inside the global vocabulary [0, ",
             global_vocab, ")");
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids) {
  vocab_parallel_embedding_forward(ctx, out, weight, ids, 0, weight.dim(0));
}

void embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate) {
  vocab_parallel_embedding_backward(ctx, dweight, dout, ids, accumulate, 0, dweight.dim(0));
}

void vocab_parallel_embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids,
                                      int64_t vocab_start, int64_t global_vocab) {
  OpCheck check(vocab_start == 0 && global_vocab == weight.dim(0) ? "embedding_forward"
                                                                   : "vocab_parallel_embedding_forward");
  check.device(ctx, {{"out", out}, {"weight", weight}, {"ids", ids}}).rank("weight", weight, 2);
  check_float(check, ctx, "weight", weight);
  check.dtype_in("ids", ids, {DType::I32, DType::I64})
      .dtype("out", out, weight.dtype())
      .shape("out", out, rows_shape(ids, weight.dim(1)));
  check_shard(check, weight, vocab_start, global_vocab);
  if (out.numel() == 0) return;
  MEGATRON_DISPATCH(ctx, cuda::embedding_forward(ctx, out, weight, ids, vocab_start, global_vocab),
                    cpu::embedding_forward(out, weight, ids, vocab_start, global_vocab));
}

void vocab_parallel_embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids,
                                       bool accumulate, int64_t vocab_start, int64_t global_vocab) {
  OpCheck check(vocab_start == 0 && global_vocab == dweight.dim(0) ? "embedding_backward"
                                                                    : "vocab_parallel_embedding_backward");
  check.device(ctx, {{"dweight", dweight}, {"dout", dout}, {"ids", ids}}).rank("dweight", dweight, 2);
  check_float(check, ctx, "dout", dout);
  if (!ctx.is_cuda() && dout.dtype() == DType::F64) check.dtype_in("dweight", dweight, {DType::F32, DType::F64});
  else check.dtype("dweight", dweight, DType::F32);
  check.dtype_in("ids", ids, {DType::I32, DType::I64}).shape("dout", dout, rows_shape(ids, dweight.dim(1)));
  check_shard(check, dweight, vocab_start, global_vocab);
  if (dweight.numel() == 0) return;
  MEGATRON_DISPATCH(ctx,
                    cuda::embedding_backward(ctx, dweight, dout, ids, accumulate, vocab_start, global_vocab),
                    cpu::embedding_backward(dweight, dout, ids, accumulate, vocab_start, global_vocab));
}

}  // namespace megatron::ops
