// SwiGLU's pointwise math on CUDA (activation.h's formulas, fp32), shared by the activation kernels and by
// the FP8 casts that compute SwiGLU on the fly (ops/fp8). Every product and sum is rounded on its own
// (__fmul_rn / __fadd_rn, never contracted into an FMA), so the two kernels, compiled apart, produce the
// same bits for the same inputs; expf and the IEEE division are nvcc's defaults (no fast math).
#pragma once

#include <cuda_runtime.h>

namespace megatron::ops::cuda {

__device__ __forceinline__ float swiglu_sigmoid(float x) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf(-x))); }

// silu(gate) * up
__device__ __forceinline__ float swiglu_value(float gate, float up) {
  return __fmul_rn(__fmul_rn(gate, swiglu_sigmoid(gate)), up);
}

// The gradients of gate and up, given dy (the gradient of silu(gate) * up):
//   dgate = dy * up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g);   dup = dy * silu(gate).
__device__ __forceinline__ float swiglu_grad_gate(float dy, float gate, float up) {
  const float s = swiglu_sigmoid(gate);
  const float slope = __fmul_rn(s, __fadd_rn(1.f, __fmul_rn(gate, __fadd_rn(1.f, -s))));
  return __fmul_rn(__fmul_rn(dy, up), slope);
}
__device__ __forceinline__ float swiglu_grad_up(float dy, float gate) {
  return __fmul_rn(dy, __fmul_rn(gate, swiglu_sigmoid(gate)));
}

}  // namespace megatron::ops::cuda
