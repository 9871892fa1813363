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
//              layernorm  the norms' outputs are not kept where a linear saves them as its input (QKV's, and a dense
//                         MLP's fc1 -- or, with mlp, the MLP's input): the backward normalises the norm's saved
//                         input again, with the same kernel, just before the linear's backward needs it. FP8
//                         linears keep their input's FP8 transpose instead, so there is nothing to drop; a MoE
//                         layer's pre-MLP norm output (the router's and experts' input) is kept;
//              moe_act    the routed experts keep fc1's output but not the activation of it that fc2 reads: the
//                         backward applies the activation again (the same kernel) before fc2's backward;
//              moe        the MoE layer keeps only its input (the pre-MLP norm's output); the backward runs its
//                         forward again -- router, token dispatch, experts -- with the router recording nothing
//                         a second time (moe_router.h), then its backward;
//              shared_experts  an MoE layer's shared experts keep nothing (their input is the router's, kept);
//                         the backward runs their MLP forward again before its backward;
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
  // full, --distribute-saved-activations: each unit's kept input split over the TP ranks (1/TP each, as
  // Megatron's split_tensor_into_1d_equal_chunks), all-gathered again before the unit's forward is recomputed;
  // without sequence parallelism, which splits it already. No effect at TP 1.
  bool distribute_saved_activations = false;
  bool mlp = false;          // selective "mlp"
  bool layernorm = false;    // selective "layernorm"
  bool moe_act = false;      // selective "moe_act"
  bool moe = false;          // selective "moe"
  bool shared_experts = false;  // selective "shared_experts"

  bool full() const { return granularity == RecomputeGranularity::Full; }
  bool selective_mlp() const { return granularity == RecomputeGranularity::Selective && mlp; }
  bool selective_layernorm() const { return granularity == RecomputeGranularity::Selective && layernorm; }
  bool selective_moe_act() const { return granularity == RecomputeGranularity::Selective && moe_act; }
  bool selective_moe() const { return granularity == RecomputeGranularity::Selective && moe; }
  bool selective_shared_experts() const { return granularity == RecomputeGranularity::Selective && shared_experts; }
  // Full recomputation's units over a chunk of `layers` layers: [first, first + count) each, in order.
  std::vector<std::pair<int, int>> units(int layers) const;
};

}  // namespace megatron::nn
