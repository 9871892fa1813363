// Activation recomputation (Megatron's --recompute-* flags): which activations a training forward drops and
// the backward computes again, trading compute for memory.
//
//   full:      whole transformer layers keep only their input (the residual stream) and the pass that ran
//              them (dropout offsets, positions); the backward runs their forward again, then their backward.
//              uniform: the stage's (model chunk's) layers in units of num_layers consecutive layers, every
//              unit recomputed (the last one may be shorter); block: the first num_layers layers of each chunk,
//              one by one, the rest keep their activations.
//   selective: the modules named, in every layer:
//              mlp        the dense MLP keeps only its input (the pre-MLP norm's output);
//              core_attn  accepted with nothing to do: the fused attention (cuDNN / the CPU kernel) never stores
//                         the score matrix, and its output is linear_proj's saved input anyway, which is what
//                         Megatron's warning about fused attention says.
//
// Recomputation repeats the forward exactly: the same dropout masks (Philox offsets are the pass's), the same
// FP8 scales (delayed: the iteration's scales, and recording the same amax again changes nothing; tensorwise:
// the same tensor gives the same amax), the same collectives. So losses and gradients are bitwise those
// without it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace megatron::nn {

enum class RecomputeGranularity { None, Full, Selective };
enum class RecomputeMethod { Uniform, Block };

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  int num_layers = 1;        // full: layers per unit (uniform) or recomputed layers per chunk (block)
  bool mlp = false;          // selective "mlp"

  bool full() const { return granularity == RecomputeGranularity::Full; }
  bool selective_mlp() const { return granularity == RecomputeGranularity::Selective && mlp; }
  // Full recomputation's units over a chunk of `layers` layers: [first, first + count) each, in order.
  std::vector<std::pair<int, int>> units(int layers) const;
};

}  // namespace megatron::nn
