// Megatron's --check-for-nan-in-loss-and-grad, on by default: a step whose loss or gradient norm is NaN or Inf
// ends the run at that iteration, before the optimizer writes NaN into the weights, instead of training on
// silently. The error names the iteration, the value and the parameters of this rank whose gradients are not
// finite, which points at the layer (and the parallel layout's piece of it) that produced them.
//
// Both values are agreed over the ranks before the check (the loss over PP and DP x CP, the norm over every
// group that holds gradients), so every rank stops at the same iteration and none waits in a collective for a
// rank that left. Off with --no-check-for-nan-in-loss-and-grad, and off by itself under fp16's dynamic loss
// scaling, where an overflowing step is skipped and the scale lowered (Megatron's rule). Without clipping
// (--clip-grad 0) no norm is computed: a NaN gradient then shows in the next iteration's loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/nn/parameter.h"
#include "megatron/runtime/context.h"

namespace megatron::trainer {

// The names of the parameters whose gradient (main_grad) on this rank holds a NaN or Inf, in list order.
// Synchronises ctx once per parameter: for the error path.
std::vector<std::string> nonfinite_gradients(Context& ctx, const nn::ParameterList& params);

// Throws megatron::Error when `loss` or `grad_norm` (when computed) is not finite; `rank` names this rank's
// gradients in the message.
void check_finite_step(Context& ctx, int64_t iteration, double loss, std::optional<double> grad_norm,
                       const nn::ParameterList& params, int rank);

// Throws megatron::Error when an evaluation's loss (agreed over the ranks) is not finite: Megatron's check covers
// its evaluation too. `where` names the evaluation ("iteration 100", "iteration 500 on test set").
void check_finite_evaluation(const std::string& where, double loss);

}  // namespace megatron::trainer
