// Floating-point operations of one training iteration, by Megatron-LM's formula
// (megatron/training/training.py, num_floating_point_operations), so TFLOP/s/GPU and MFU compare with
// Megatron's log line:
//   F = T * [ 6 h f k L  +  6 L ( h (n d + 2 g d) + n d h )  +  6 h V ]  +  6 n d L (B s^2)
// with T = B s tokens, k = 3 with SwiGLU else 2, d = kv channels, n heads, g query groups, L layers,
// f ffn width, V the padded vocabulary. The last term is attention's QK^T and PV, halved for causal masking.
// Packed documents (--reset-attention-mask) compute only each document's own scores: `document_squares`, the
// sum of the squared document lengths of the global batch's rows, then replaces B s^2 (a row holding one
// document gives B s^2 again), so the TFLOP/s count only the attention actually computed.
#pragma once

#include <cstdint>

#include "megatron/train/arguments.h"

namespace megatron::train {

double num_floating_point_operations(const Arguments& args, int64_t batch_size, double document_squares = 0);

// TFLOP/s per GPU for an iteration of `seconds` at global batch size `batch_size` (document_squares as above;
// 0: whole rows).
double tflops_per_gpu(const Arguments& args, int64_t batch_size, double seconds, double document_squares = 0);

}  // namespace megatron::train
