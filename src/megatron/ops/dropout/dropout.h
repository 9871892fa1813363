// Dropout from counter-based random numbers: no mask tensor is stored; the backward regenerates it.
//
// Mask: element i (row-major position in the tensor) is kept iff
//   philox_uniform(seed, offset, index_base + i) >= p          (core/philox.h; identical on CPU and GPU)
// so the mask depends only on (seed, offset, global index): a tensor sharded along its leading dimension
// (tensor/sequence parallel shards, micro-batch slices) reproduces the whole tensor's mask when each shard
// passes index_base = the global position of its first element. `offset` separates dropout calls of one
// step (each call site takes a distinct offset).
// Values: kept elements are scaled by scale = float(1 / (1 - p)) (0 when p == 1): y = float(x) * scale,
//   one fp32 multiply rounded to the output dtype, so CPU and CUDA outputs are bit-identical (F64 on the
//   CPU uses double). Dropped elements are exactly 0. p == 0 is the identity.
// Dtypes: all tensors of a call share one dtype: F32, BF16 or F16 (F64 on the CPU). Outputs are assigned.
#pragma once

#include <cstdint>

#include "megatron/runtime/context.h"

namespace megatron::ops {

// y = keep ? x * scale : 0; y and x have the same shape (any rank).
void dropout_forward(Context& ctx, const Tensor& y, const Tensor& x, float p, uint64_t seed, uint64_t offset,
                     uint64_t index_base = 0);
// dx = keep ? dy * scale : 0, with the forward's (p, seed, offset, index_base).
void dropout_backward(Context& ctx, const Tensor& dx, const Tensor& dy, float p, uint64_t seed, uint64_t offset,
                      uint64_t index_base = 0);

// Megatron's fused bias-dropout-add: y = residual + dropout(x + bias), x/residual/y [..., H], bias [H] (may
// be undefined: no bias). fp32 math: v = float(x) + float(bias); y = float(residual) + (keep ? v * scale : 0).
// Its backward is dropout_backward for x (dbias = the column sums of that dx) and the identity for residual.
void bias_dropout_add_forward(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& bias,
                              const Tensor& residual, float p, uint64_t seed, uint64_t offset,
                              uint64_t index_base = 0);

}  // namespace megatron::ops
