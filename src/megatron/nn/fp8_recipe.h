// Fp8Recipe: how a model runs its FP8 linears (Transformer Engine's recipes as Megatron selects them with
// --fp8-format / --fp8-recipe and friends).
//
// - format: E4M3 everywhere, or Hybrid (E4M3 for inputs and weights, E5M2 for output gradients: more range,
//   less precision, where gradients need it).
// - scaling: Delayed (each tensor's scale comes from the amaxes of earlier iterations: the history of length
//   amax_history_len, its newest entry ("most_recent") or its maximum ("max"), then
//   scale = fp8_max / amax / 2^margin; the amaxes of an iteration are reduced over the model's TP x DP x CP
//   group once per iteration) or Tensorwise (current scaling: the amax of the tensor being cast, computed just
//   before the cast; scale = fp8_max / amax / 2^margin) or Blockwise (DeepSeek-V3's block scaling, Transformer
//   Engine's Float8BlockScaling: inputs and output gradients get one power-of-two scale per 1 x 128 block
//   along the dimension each GEMM reduces over, weights one per 128 x 128 block; every cast is its own
//   current scaling, with no amax reduction and no state; margin and history do not apply).
// - Which linears: those of the transformer layers (QKV, projection, fc1, fc2) except the first
//   `layers_at_start_in_bf16` and last `layers_at_end_in_bf16` layers (--first-last-layers-bf16), and except a
//   MoE layer's experts and router. Attention, embeddings, norms, the output layer and the loss stay in the
//   parameter dtype, as Megatron's default.
#pragma once

#include <cstdint>

#include "megatron/core/dtype.h"

namespace megatron::nn {

enum class Fp8Format : uint8_t { E4M3, Hybrid };
enum class Fp8Scaling : uint8_t { Delayed, Tensorwise, Blockwise };

struct Fp8Recipe {
  bool enabled = false;
  Fp8Format format = Fp8Format::Hybrid;
  Fp8Scaling scaling = Fp8Scaling::Delayed;
  int margin = 0;
  int amax_history_len = 1;
  bool amax_compute_max = false;  // "max" over the history, else "most_recent"
  int layers_at_start_in_bf16 = 0;
  int layers_at_end_in_bf16 = 0;

  // Whether global layer `layer` (0-based, of num_layers) runs its linears in FP8.
  bool fp8_layer(int layer, int num_layers) const {
    return enabled && layer >= layers_at_start_in_bf16 && layer < num_layers - layers_at_end_in_bf16;
  }
  // Inputs and weights: E4M3; output gradients: E5M2 with the hybrid format.
  DType forward_dtype() const { return DType::F8E4M3; }
  DType grad_dtype() const { return format == Fp8Format::Hybrid ? DType::F8E5M2 : DType::F8E4M3; }
};

// The largest finite value of an fp8 dtype (E4M3 448, E5M2 57344).
float fp8_max(DType fp8);

}  // namespace megatron::nn
