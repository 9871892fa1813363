// CPU reference of the fp8 family (see fp8.h). Arguments are validated by the caller; `out`, `out_t` and
// `amax` may be undefined (not wanted), and pow2_margin is 2^margin as a normal fp32.
#pragma once

#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

void fp8_cast_transpose(const Tensor& out, const Tensor& out_t, const Tensor& amax, const Tensor& in,
                        const Tensor& scale);

void fp8_scale_from_amax(const Tensor& scale, const Tensor& scale_inv, const Tensor& amax, float fp8_max,
                         float pow2_margin, bool keep_on_invalid);

void fp8_delayed_scaling_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, float fp8_max,
                                float pow2_margin, bool use_max);

}  // namespace megatron::ops::cpu
