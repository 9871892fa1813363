// MoeConfig: the Mixture-of-Experts part of a model's configuration (Megatron-core's num_moe_experts,
// moe_* fields), as typed values. num_experts == 0: every layer is dense.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::nn {

enum class RouterScore { Softmax, Sigmoid, SqrtSoftplus };
// The load-balancing losses Megatron can apply at once, each with its coefficient.
enum class AuxLossType { AuxLoss, SeqAuxLoss, GlobalAuxLoss };
enum class TokenDispatcher { AllGather, AllToAll };
enum class TokenDropPolicy { Probs, Position };

struct AuxLoss {
  AuxLossType type;
  double coeff;
};

struct MoeConfig {
  int num_experts = 0;
  int64_t ffn_hidden_size = 0;        // each routed expert's MLP width
  int topk = 2;
  RouterScore score = RouterScore::Softmax;
  bool pre_softmax = false;           // softmax: scores over all experts, then top-k (else top-k, then softmax)
  int num_groups = 0;                 // device-limited routing: expert groups (0: off)
  int group_topk = 0;                 // groups each token may use
  double topk_scaling_factor = 0;     // probs x this (0: none)
  std::vector<AuxLoss> aux_losses;    // coefficients > 0 only
  bool sinkhorn = false;              // Sinkhorn routing (moe_sinkhorn.h) instead of the top-k of the scores
  double z_loss_coeff = 0;            // 0: none
  bool expert_bias = false;           // aux-loss-free balancing (selection bias, updated once per step)
  double bias_update_rate = 1e-3;
  double capacity_factor = 0;         // 0: dropless
  TokenDropPolicy drop_policy = TokenDropPolicy::Probs;
  bool pad_to_capacity = false;
  TokenDispatcher dispatcher = TokenDispatcher::AllGather;
  bool per_expert_gemm = true;        // the local experts as one GEMM each instead of one grouped launch (CUDA)
  int64_t shared_expert_ffn = 0;      // shared experts' total MLP width (0: none)
  // --moe-shared-expert-gate: the shared experts' output scaled per token by sigmoid(x . gate_weight) (Qwen2-MoE)
  bool shared_expert_gate = false;
  std::vector<bool> layer_is_moe;     // per layer (global numbering from 0); empty: every layer

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const {
    return enabled() && (layer_is_moe.empty() || (layer >= 0 && size_t(layer) < layer_is_moe.size() && layer_is_moe[size_t(layer)]));
  }
};

}  // namespace megatron::nn
