// CUDA kernels of the fp8 family (see fp8.h), queued on ctx's stream. Arguments are validated by the
// caller; `out`, `out_t` and `amax` may be undefined (not wanted), and pow2_margin is 2^margin as a normal
// fp32.
#pragma once

#include "megatron/runtime/context.h"

namespace megatron::ops::cuda {

void fp8_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale);

// The fused casts (fp8.h): false, with nothing queued, when the inputs do not suit their vector loads (a
// pointer not 16-byte aligned, or F not a multiple of 16 bytes' worth of elements); the caller then runs
// the activation op and the cast apart.
bool fp8_swiglu_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                               const Tensor& x, const Tensor& scale);
bool fp8_swiglu_grad_cast_transpose(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& amax,
                                    const Tensor& dy, const Tensor& x, const Tensor& scale);

void fp8_scale_from_amax(Context& ctx, const Tensor& scale, const Tensor& scale_inv, const Tensor& amax,
                         float fp8_max, float pow2_margin, bool keep_on_invalid);

void fp8_delayed_scaling_update(Context& ctx, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                float fp8_max, float pow2_margin, bool use_max);

}  // namespace megatron::ops::cuda
