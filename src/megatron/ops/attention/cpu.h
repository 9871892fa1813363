// CPU attention, the reference (see attention.h for the contract, cpu.cpp for the blocking). Arguments
// are validated by the caller.
#pragma once

#include "megatron/ops/attention/attention_dropout.h"
#include "megatron/tensor/tensor.h"

namespace megatron::ops::cpu {

void attention_forward(const Tensor& out, const Tensor& stats, const Tensor& q, const Tensor& k, const Tensor& v,
                       bool causal, double scale, const AttentionDropout& dropout);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& stats, bool causal,
                        double scale, const AttentionDropout& dropout);

}  // namespace megatron::ops::cpu
