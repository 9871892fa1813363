// CUDA kernels of the fp8 family (see fp8.h), queued on ctx's stream. Arguments are validated by the
// caller; `out`, `out_t` and `amax` may be undefined (not wanted), and pow2_margin is 2^margin as a normal
// fp32.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void fp8_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale);

void fp8_scale_from_amax(Context& ctx, const Tensor& scale, const Tensor& scale_inv, const Tensor& amax,
                         float fp8_max, float pow2_margin, bool keep_on_invalid);

void fp8_delayed_scaling_update(Context& ctx, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                float fp8_max, float pow2_margin, bool use_max);

}  // namespace megatron::ops::cuda
