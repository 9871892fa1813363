// CUDA kernels of the embedding family (launched on ctx.stream()); arguments validated by embedding.cpp.
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& weight, const Tensor& ids,
                       int64_t vocab_start, int64_t global_vocab);
void embedding_backward(Context& ctx, const Tensor& dweight, const Tensor& dout, const Tensor& ids, bool accumulate,
                        int64_t vocab_start, int64_t global_vocab);

}  // namespace megatron::ops::cuda
