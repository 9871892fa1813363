// CUDA kernels of the qkv family (see qkv.h). Arguments are validated by the caller.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

// One kernel for both directions: forward packed -> (q, k, v), rotating q and k by +angle; backward
// (dq, dk, dv) -> packed, rotating by -angle. rot_dim == 0: no rotation (plain split/merge).
void qkv_split_merge(Context& ctx, const Tensor& packed, const Tensor& q, const Tensor& k, const Tensor& v,
                     bool forward, int64_t rot_dim, double base, bool interleaved, int64_t position_offset);

}  // namespace megatron::ops::cuda
