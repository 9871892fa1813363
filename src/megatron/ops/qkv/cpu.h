// CPU reference of the qkv family (see qkv.h). Arguments are validated by the caller.
#pragma once

#include <optional>

#include "megatron/ops/rope/rope.h"
#include "megatron/runtime/context.h"

namespace megatron::ops::cpu {

// forward: packed -> q, k, v (then q, k rotated); backward: dq, dk rotated back, then packed.
void split_qkv(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
               const std::optional<RopeOptions>& rope);
void merge_qkv(Context& ctx, const Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv,
               const std::optional<RopeOptions>& rope);

}  // namespace megatron::ops::cpu
