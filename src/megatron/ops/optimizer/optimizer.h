// Multi-tensor optimizer ops: the AdamW step, the global L2 norm (gradient clipping) and scaling with an
// inf/NaN flag (loss-scale unscaling, clipping). On CUDA each op covers many tensors per launch: the tensor
// pointers and sizes travel as kernel parameters in batches of up to 64 tensors (like apex's
// multi_tensor_apply), every block working on one fixed-size chunk of one tensor. Tensors may have any shape;
// they are treated as flat arrays of numel() elements. Zero-element tensors are allowed and skipped.
//
// adamw_step (torch.optim.AdamW / Megatron semantics, decoupled weight decay), per element, in fp32 on CUDA
// and in double on the CPU:
//   g  = grad * grad_scale
//   p  = p - lr * wd * p                        (wd: the entry's weight_decay if set, else config.weight_decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
//   model_param = p rounded to model_param's dtype (when defined)
// param (the fp32 master), exp_avg and exp_avg_sq are updated in place (F32; F64 also on the CPU, all three
// the same). grad: F32, BF16 or F16 (F64 on the CPU). model_param: optional, F32, BF16 or F16, assigned.
//
// multi_tensor_l2_norm: out[0] = sqrt(sum over all tensors and elements of x^2) and, when per_tensor_out is
// defined, per_tensor_out[i] = the norm of tensors[i] (assigned). Inputs F32, BF16 or F16 (F64 on the CPU);
// outputs F32 (F64 allowed on the CPU). Squares are summed in fp32 within a thread's few elements and in
// double beyond (CPU: double throughout), in a fixed order: no atomics, bitwise reproducible run to run.
//
// multi_tensor_count_zeros: out[0] = the number of elements equal to zero (+0 or -0) over all tensors
// (Megatron's --log-num-zeros-in-grad), assigned; out I64 [1]. Inputs F32, BF16 or F16 (F64 on the CPU). Exact
// and order-free (an integer count).
//
// multi_tensor_scale: outs[i] = ins[i] * scale (assigned; outs[i] may be ins[i] itself). ins and outs: F32,
// BF16 or F16 (F64 on the CPU), any pairing. The product is computed in fp32 (double for F64). found_inf,
// when defined (F32 [1] or I32 [1]), is set to 1 if any stored result is inf or NaN; it is never cleared
// here: zero it before the first of a series of calls.
#pragma once

#include <optional>
#include <vector>

#include "megatron/runtime/context.h"

namespace megatron::ops {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;         // 1-based count of steps taken, this one included (bias correction)
  float grad_scale = 1.0f;  // grads are multiplied by this first (1 / loss scale, clip coefficient)
};

struct AdamParamGroupTensors {
  Tensor param;       // fp32 master weights [n], updated in place
  Tensor exp_avg;     // [n], updated in place
  Tensor exp_avg_sq;  // [n], updated in place
  Tensor grad;        // [n], read
  Tensor model_param;  // optional [n]: assigned the updated master, rounded (e.g. the bf16 weights)
  std::optional<float> weight_decay;  // overrides AdamWConfig::weight_decay (Megatron: 0 for biases and norms)
};

void adamw_step(Context& ctx, const std::vector<AdamParamGroupTensors>& tensors, const AdamWConfig& config);

// per_tensor_out may be an undefined Tensor.
void multi_tensor_l2_norm(Context& ctx, const Tensor& out, const Tensor& per_tensor_out,
                          const std::vector<Tensor>& tensors);

void multi_tensor_count_zeros(Context& ctx, const Tensor& out, const std::vector<Tensor>& tensors);

// found_inf may be an undefined Tensor.
void multi_tensor_scale(Context& ctx, const std::vector<Tensor>& outs, const Tensor& found_inf,
                        const std::vector<Tensor>& ins, float scale);

}  // namespace megatron::ops
