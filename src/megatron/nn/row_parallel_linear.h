// RowParallelLinear: Megatron's row-parallel linear layer (tensor_parallel/layers.py), y = x W^T + b with
// W [out, in] split by input columns over the TP ranks: rank r holds W_r [out, in / TP] and computes the
// partial product x_r W_r^T from its slice x_r [rows, in / TP] of the input; the partials are summed over TP.
// The bias [out] is replicated (every rank holds it whole) and added once: rank 0 adds it in its GEMM's
// epilogue before the sum, which is the same function as Megatron's add after the reduction.
//
// Collectives (parallel/mappings.h):
//   without sequence parallelism: the partials are all-reduced (reduce_from_tp; backward identity);
//   with sequence parallelism: they are reduce-scattered over token rows (reduce_scatter_to_sp), so y is this
//     rank's rows; backward all-gathers dy first.
//   input_is_parallel = false: x is the whole input on every rank and the layer takes its columns itself
//     (scatter_to_tp; backward all-gathers dx along the last dimension).
// The weight and bias gradients come from the whole dy on every rank (no further reduction: the bias
// gradient is the same on every rank). At TP = 1 the layer is exactly linear_forward/linear_backward.
//
// forward(ctx, y, x): x [rows, in / TP] ([rows, in] without input_is_parallel); y [rows_y, out] assigned,
//   rows_y = rows / TP under SP, else rows. Returns what backward needs (x's slice of this rank). x may be a
//   produced operand (linear_operand.h, e.g. SwiGLU's output): an FP8 layer with input_is_parallel computes
//   it inside its input's cast, any other layer materialises it first.
// backward(ctx, saved, dx, dy, dx_gelu_input): dy like y; dx like x (assigned; may be undefined);
//   dx_gelu_input as in linear.h (the pre-GELU values of this rank's slice of the input, input_is_parallel
//   only); main grads accumulated (+=). Consumes `saved`.
// enable_fp8(state): the layer's three GEMMs run in FP8 from now on (fp8_linear.h), registered with the model
//   chunk's scaling state.
#pragma once

#include <memory>
#include <string>

#include "megatron/nn/fp8_linear.h"
#include "megatron/nn/linear.h"
#include "megatron/parallel/tensor_parallel.h"

namespace megatron::nn {

struct RowParallelOptions {
  bool input_is_parallel = true;
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  // in_features, out_features: the whole layer's. Parameters "<name>.weight" [out, in / TP], "<name>.bias" [out].
  RowParallelLinear(Context& ctx, const std::string& name, int64_t in_features, int64_t out_features, bool bias,
                    DType dtype, const parallel::TensorParallel& tp, RowParallelOptions options = {});

  // weight ~ normal(0, std) by whole-tensor element index (this rank's columns of the TP = 1 init), bias = 0.
  void init(Context& ctx, uint64_t seed, double std);
  [[nodiscard]] LinearSaved forward(Context& ctx, const Tensor& y, const LinearOperand& x) const;
  void backward(Context& ctx, LinearSaved&& saved, const Tensor& dx, const Tensor& dy,
                const Tensor& dx_gelu_input = Tensor());
  void collect_parameters(ParameterList& out);
  // sequence_group: the CP group when the activations are split along the sequence (else null).
  void enable_fp8(const std::shared_ptr<Fp8ScalingState>& state, comm::Communicator* sequence_group = nullptr);
  bool fp8() const { return fp8_.enabled(); }

  int64_t in_features() const { return weight.value.dim(1); }  // this rank's (in / TP)
  int64_t out_features() const { return weight.value.dim(0); }

  Parameter weight;
  Parameter bias;  // undefined without bias; replicated

 private:
  // y (or the partial sum under TP) = x W^T (+ the bias on one rank), in the parameter dtype or FP8.
  LinearSaved local_forward(Context& ctx, const Tensor& y, const LinearOperand& x, const Parameter* bias) const;
  void local_backward(Context& ctx, LinearSaved&& saved, const Tensor& dx, const Tensor& dy,
                      const Tensor& dx_gelu_input);
  // The weight and the input are split over TP; the output gradient is whole.
  Fp8TensorSplit fp8_split() const {
    return {.group = tp_.group.get(), .input = true, .weight = true, .grad = false, .sequence_group = sequence_group_};
  }

  parallel::TensorParallel tp_;
  RowParallelOptions options_;
  Fp8Site fp8_;
  comm::Communicator* sequence_group_ = nullptr;  // FP8 under context parallelism: the CP group
};

}  // namespace megatron::nn
