// Fp8ScalingState: the FP8 bookkeeping of one model chunk's FP8 linears -- delayed scaling's amax histories
// and scales, and the weights' FP8 copies -- owned by the GPTModel and shared by its linears, each of which
// registers once and keeps its index (Fp8Site).
//
// Delayed scaling keeps, per linear, three tensors' state: its input and weight (the forward format) and its
// output gradient (the backward format), as Transformer Engine's fp8_meta "scaling_fwd" / "scaling_bwd":
//   forward:  history [L, 2n] (column 2i the input of linear i, 2i + 1 its weight), scale [2n], scale_inv [2n]
//   backward: history [L, n]  (column i the output gradient of linear i),           scale [n],  scale_inv [n]
// Row 0 of a history collects the amaxes of the running iteration (every cast max-accumulates into it while
// recording()); end_iteration() reduces row 0 over the amax group, turns the histories into the next scales
// and rolls them (ops/fp8/fp8.h, fp8_delayed_scaling_update). Scales start at 1 and histories at 0, as in
// Transformer Engine, so the first iteration casts with scale 1. Within an iteration every micro-batch uses the
// same scales: that is what makes a data-parallel run (amaxes reduced over DP) equal to one rank accumulating
// the same micro-batches.
// Tensorwise scaling keeps no history: each cast computes its own scale (fp8_linear.h).
//
// The weights' FP8 copies (W and W^T, cuBLASLt's fp8 GEMMs take K-major operands) are made by the first
// forward of an iteration and reused by every micro-batch; end_iteration() and invalidate_weights() drop them.
// A weight kept in FP8 (--fp8-param-gather) is quantised by the distributed optimizer instead, with this state's
// weight scale; its delayed-scaling amax is recorded by that cast (optim/distributed_optimizer.h), so the
// trainer ends the iteration (end_iteration) before the optimizer step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/nn/fp8_recipe.h"
#include "megatron/ops/gemm/gemm.h"
#include "megatron/runtime/context.h"

namespace megatron::nn {

// One tensor's delayed-scaling state: views (F32 [1]) into the histories' row 0 and the scale vectors.
struct Fp8TensorScaling {
  Tensor amax, scale, scale_inv;
};

// A weight's FP8 copies for the running iteration.
struct Fp8CastWeight {
  Tensor w;            // [out, in]
  Tensor w_t;          // [in, out]
  Tensor scale_inv;    // w's: F32 [1], or its 128 x 128 block scales (blockwise recipe) ...
  Tensor scale_inv_t;  // ... w_t's (the same F32 [1] tensor under per-tensor scaling)
  ops::Fp8ScaleLayout layout = ops::Fp8ScaleLayout::Tensor;
};

class Fp8ScalingState {
 public:
  explicit Fp8ScalingState(const Fp8Recipe& recipe) : recipe_(recipe) {}

  // Registers a linear (its parameter name prefix, e.g. "decoder.layers.3.mlp.linear_fc1"); before allocate().
  int add_linear(const std::string& name);
  // Allocates the histories (zero) and scales (one) on ctx's device.
  void allocate(Context& ctx);

  const Fp8Recipe& recipe() const { return recipe_; }
  int size() const { return int(names_.size()); }
  const std::string& name(int linear) const { return names_.at(size_t(linear)); }

  Fp8TensorScaling input(int linear) const;
  Fp8TensorScaling weight(int linear) const;
  Fp8TensorScaling grad(int linear) const;

  // Whether casts record their amaxes (training); evaluation and generation turn it off.
  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }

  // The weight's FP8 copies of this iteration, or nullptr when not cast yet.
  const Fp8CastWeight* cast_weight(int linear) const;
  void set_cast_weight(int linear, Fp8CastWeight cast);
  void invalidate_weights();

  // Once per training iteration, after the last backward and before the next forward; collective over
  // `amax_group` (null: this rank alone), which must be the same ranks for every linear of the chunk (the
  // stage's TP x DP x CP ranks): delayed scaling all-reduces the histories with max (row 0 holds this
  // iteration's amaxes; the other rows are equal on every rank already), updates the scales and rolls the
  // histories. Both recipes drop the weights' FP8 copies.
  void end_iteration(Context& ctx, comm::Communicator* amax_group);

  // One linear's delayed-scaling state packed as F32 [L + 2, 3] (checkpoints): rows 0 .. L-1 its amax
  // history, row L the scales, row L + 1 the inverse scales; columns its input, weight and output gradient.
  Tensor packed_linear_state(Context& ctx, int linear) const;
  // Restores what packed_linear_state returned (same shape: the history length must match).
  void unpack_linear_state(Context& ctx, int linear, const Tensor& packed);

  // The delayed-scaling tensors (checkpoints, statistics).
  const Tensor& forward_history() const { return fwd_history_; }
  const Tensor& forward_scale() const { return fwd_scale_; }
  const Tensor& forward_scale_inv() const { return fwd_scale_inv_; }
  const Tensor& backward_history() const { return bwd_history_; }
  const Tensor& backward_scale() const { return bwd_scale_; }
  const Tensor& backward_scale_inv() const { return bwd_scale_inv_; }

 private:
  static Fp8TensorScaling column(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, int64_t c);

  Fp8Recipe recipe_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Fp8CastWeight>> weights_;
  bool recording_ = true;
  Tensor fwd_history_, fwd_scale_, fwd_scale_inv_;
  Tensor bwd_history_, bwd_scale_, bwd_scale_inv_;
};

// A linear's handle on its chunk's state (state null: the linear runs in the parameter dtype).
struct Fp8Site {
  std::shared_ptr<Fp8ScalingState> state;
  int index = -1;
  bool enabled() const { return state != nullptr; }
};

// Registers the linear whose weight parameter is `weight_name` ("<linear>.weight") with `state`.
Fp8Site register_fp8_linear(const std::shared_ptr<Fp8ScalingState>& state, const std::string& weight_name);

}  // namespace megatron::nn
