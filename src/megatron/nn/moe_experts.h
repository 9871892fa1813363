// GroupedExperts: this rank's routed experts of one MoE layer, each a Megatron MLP (linear_fc1 -> SwiGLU or
// GELU -> linear_fc2, no biases), computed over rows grouped by expert with grouped GEMMs (one launch for all
// local experts; ops/grouped_gemm).
//
// Parameters (one tensor per linear, expert dimension first; Megatron's expert weights stacked):
//   linear_fc1.weight  whole [E, F * (2 if SwiGLU), h]   init std
//   linear_fc2.weight  whole [E, h, F]                   init std / sqrt(2 * layers)
// split over expert parallelism along dim 0 (this rank holds experts [ep_rank * E / EP, ...)) and over expert
// tensor parallelism like the dense MLP (fc1 by columns, two blocks with SwiGLU; fc2 by rows of its input), so
// this rank's fc2 output is a partial sum over the expert-TP ranks.
// forward(ctx, out, x, counts): x [rows, h] grouped by local expert (counts[e] rows each, on the host, summing
//   to rows) -> out [rows, h] assigned (a partial sum under expert TP). Returns what the backward needs.
// backward(ctx, saved, dx, dout): dx [rows, h] assigned; main grads accumulated (+=); consumes saved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/nn/parameter.h"
#include "megatron/nn/transformer_config.h"
#include "megatron/ops/grouped_gemm/grouped_gemm.h"

namespace megatron::nn {

// The ranks an MoE layer's experts are spread over.
struct ExpertLayout {
  int ep_rank = 0, ep_size = 1;    // expert parallelism
  int etp_rank = 0, etp_size = 1;  // expert tensor parallelism
};

struct ExpertsSaved {
  Tensor x;        // [rows, h]
  Tensor pre_act;  // fc1's output [rows, F / ETP (x 2 with SwiGLU)]
  Tensor act;      // [rows, F / ETP]; undefined with selective "moe_act" recomputation (the backward redoes it)
  std::vector<int64_t> counts;
};

class GroupedExperts {
 public:
  GroupedExperts() = default;
  GroupedExperts(Context& ctx, const std::string& name, const TransformerConfig& config, const ExpertLayout& layout);

  void init(Context& ctx, const TransformerConfig& config);
  [[nodiscard]] ExpertsSaved forward(Context& ctx, const Tensor& out, const Tensor& x,
                                     std::vector<int64_t> counts) const;
  void backward(Context& ctx, ExpertsSaved&& saved, const Tensor& dx, const Tensor& dout);
  void collect_parameters(ParameterList& out);

  int local_experts() const { return local_experts_; }
  int first_expert() const { return first_expert_; }

  Parameter linear_fc1, linear_fc2;

 private:
  bool swiglu_ = false;
  bool recompute_act_ = false;  // selective "moe_act": act is not kept; the backward applies the activation again
  ops::GroupedGemmOptions gemm_;  // the forward's (transpose_w) and the algorithm of every call
  int64_t ffn_ = 0;  // F / ETP
  int local_experts_ = 0, first_expert_ = 0;
};

}  // namespace megatron::nn
